#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
echo "Hello, world!" > hello.txt
