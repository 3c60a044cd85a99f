#!/usr/bin/env bash
# Passes (exit 0) when the count matches the expected one in $TEST_DIR.
[ "$(cat /app/count.txt 2>/dev/null)" = "$(cat "$TEST_DIR/expected.txt")" ]
