#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
sed -i 's/range(1, n)/range(1, n + 1)/' sum_range.py
