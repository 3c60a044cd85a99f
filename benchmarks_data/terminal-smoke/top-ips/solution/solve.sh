#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
cut -d' ' -f1 access.log | sort | uniq -c | awk '{print $1, $2}' | sort -k1,1nr -k2,2 > top_ips.txt
