#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
python3 -c '
import json
users = json.load(open("users.json"))
print("\n".join(sorted(u["name"] for u in users if u["active"])))
' > active.txt
