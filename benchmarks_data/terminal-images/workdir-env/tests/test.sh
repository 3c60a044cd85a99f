#!/usr/bin/env bash
mkdir -p /logs/verifier
# test.sh runs in the image's working directory, with [verifier.env].
if [ "$(pwd)" = /srv/project ] && [ "$(cat greeting.txt 2>/dev/null)" = "$EXPECTED" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
