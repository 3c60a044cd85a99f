#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
mkdir -p project/src project/tests project/docs
: > project/README.md
