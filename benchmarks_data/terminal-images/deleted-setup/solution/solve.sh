#!/usr/bin/env bash
set -e
sed -n 's/^build=//p' /etc/build-info > /app/build.txt
