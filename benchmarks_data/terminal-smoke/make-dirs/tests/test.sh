#!/usr/bin/env bash
# Deliberately broken verifier: it checks the work but never writes a reward
# file, so the task scores 0 with a WARNING "reward_missing" (the demo's warning).
app="${APP_DIR:-/app}"
for d in src tests docs; do
  [ -d "$app/project/$d" ] || { echo "missing project/$d"; exit 1; }
done
[ -f "$app/project/README.md" ] && [ ! -s "$app/project/README.md" ] || { echo "bad README.md"; exit 1; }
echo "all checks passed (but no reward written)"
