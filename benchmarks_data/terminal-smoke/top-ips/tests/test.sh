#!/usr/bin/env bash
# Verifier: writes 1 (pass) or 0 (fail) to the reward file.
app="${APP_DIR:-/app}"
verifier="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"

check() {
  expected=$(printf '%s\n' "3 10.0.0.1" "2 10.0.0.7" "2 192.168.1.5" "1 172.16.0.2")
  [ "$(cat "$app/top_ips.txt" 2>/dev/null)" = "$expected" ]
}

if check; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
