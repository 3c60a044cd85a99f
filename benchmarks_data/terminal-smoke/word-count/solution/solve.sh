#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
wc -w < essay.txt | tr -d ' ' > count.txt
