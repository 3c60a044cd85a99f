#!/usr/bin/env bash
# Verifier: writes 1 (pass) or 0 (fail) to the reward file.
app="${APP_DIR:-/app}"
verifier="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"

check() {
  cd "$app" || return 1
  [ "$(python3 sum_range.py 10)" = "55" ] && [ "$(python3 sum_range.py 1)" = "1" ] \
    && [ "$(python3 sum_range.py 100)" = "5050" ]
}

if check; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
