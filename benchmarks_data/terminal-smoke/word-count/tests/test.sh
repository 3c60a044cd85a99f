#!/usr/bin/env bash
# Verifier: writes 1 (pass) or 0 (fail) to the reward file.
app="${APP_DIR:-/app}"
verifier="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"

check() {
  [ "$(tr -d '[:space:]' < "$app/count.txt" 2>/dev/null)" = "45" ]
}

if check; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
