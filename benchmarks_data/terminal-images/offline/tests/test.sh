#!/usr/bin/env bash
mkdir -p /logs/verifier
# Offline while the agent ran: it saw loopback and nothing else.
if [ "$(cat /app/interfaces.txt 2>/dev/null)" = "lo" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
