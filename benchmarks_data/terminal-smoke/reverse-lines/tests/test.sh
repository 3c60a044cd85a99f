#!/usr/bin/env bash
# Verifier: writes 1 (pass) or 0 (fail) to the reward file.
app="${APP_DIR:-/app}"
verifier="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"

check() {
  expected=$(printf '%s\n' "and then some more" "write a line" "zebras gallop" "a quiet start")
  [ "$(cat "$app/reversed.txt" 2>/dev/null)" = "$expected" ]
}

if check; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
