#!/usr/bin/env bash
# Deliberately WRONG reference solution: it sorts the lines in reverse instead
# of reversing their order, so the oracle scores 0 here (the demo's failure).
set -e
cd "${APP_DIR:-/app}"
sort -r poem.txt > reversed.txt
