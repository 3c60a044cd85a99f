#!/usr/bin/env bash
# Verifier: writes 1 (pass) or 0 (fail) to the reward file.
app="${APP_DIR:-/app}"
verifier="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"

check() {
  cd "$app/photos" || return 1
  [ "$(ls | tr '\n' ' ')" = "photo-001.jpg photo-002.jpg photo-017.jpg " ] \
    && [ "$(cat photo-017.jpg)" = "seventeen" ]
}

if check; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
