#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
awk -F, 'NR > 1 && $2 == "west" { total += $3 } END { print total }' sales.csv > west_total.txt
