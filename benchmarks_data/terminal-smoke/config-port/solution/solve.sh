#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}"
python3 - <<'EOF'
lines = open("server.ini").read().splitlines()
section = None
for i, line in enumerate(lines):
    if line.startswith("["):
        section = line.strip("[]")
    elif section == "server" and line.startswith("port ="):
        lines[i] = "port = 9090"
open("server.ini", "w").write("\n".join(lines) + "\n")
EOF
