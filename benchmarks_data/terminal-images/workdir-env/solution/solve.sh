#!/usr/bin/env bash
set -e
[ "$SOLUTION_NOTE" = "from task.toml" ]
echo "$GREETING, $AUDIENCE!" > greeting.txt
