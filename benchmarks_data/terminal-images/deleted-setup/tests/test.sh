#!/usr/bin/env bash
mkdir -p /logs/verifier
if [ "$(cat /app/build.txt 2>/dev/null)" = "4711" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
