#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
sha256sum data.txt | cut -d' ' -f1 > data.sha256
