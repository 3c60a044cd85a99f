#!/usr/bin/env bash
mkdir -p /logs/verifier
# Reads a root-only file and writes under /etc: it needs root.
if [ "$(cat /root/audit/token)" = "audit-token" ] && [ "$(cat /app/status.txt 2>/dev/null)" = "ready" ] \
   && echo checked > /etc/audit-checked; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
