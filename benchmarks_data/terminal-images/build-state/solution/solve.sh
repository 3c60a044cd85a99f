#!/usr/bin/env bash
set -e
total=0
for f in /opt/inventory/*; do total=$((total + $(cat "$f"))); done
echo "$total" > /app/total.txt
