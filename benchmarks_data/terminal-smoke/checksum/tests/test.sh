#!/usr/bin/env bash
# Verifier: writes 1 (pass) or 0 (fail) to the reward file.
app="${APP_DIR:-/app}"
verifier="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"

check() {
  expected=$(sha256sum "$app/data.txt" | cut -d' ' -f1)
  [ -n "$expected" ] && [ "$(tr -d '[:space:]' < "$app/data.sha256" 2>/dev/null)" = "$expected" ]
}

if check; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
