#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
grep ' ERROR ' app.log | awk '{print $3}' | tr -d '[]' | sort | uniq -c | awk '{print $2, $1}' > errors.txt
