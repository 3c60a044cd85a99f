#!/usr/bin/env bash
mkdir -p /logs/verifier
# The file was renamed in the image: the COPY's own name must not exist.
if [ "$(cat /app/port.txt 2>/dev/null)" = "8431" ] && [ ! -e /etc/shop/defaults.ini ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
