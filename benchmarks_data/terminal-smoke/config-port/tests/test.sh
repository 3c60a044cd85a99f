#!/usr/bin/env bash
# Verifier: writes 1 (pass) or 0 (fail) to the reward file.
app="${APP_DIR:-/app}"
verifier="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"

check() {
  f="$app/server.ini"
  grep -qx 'port = 9090' "$f" 2>/dev/null && grep -qx 'port = 5432' "$f" \
    && [ "$(wc -l < "$f")" -eq 7 ]
}

if check; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
