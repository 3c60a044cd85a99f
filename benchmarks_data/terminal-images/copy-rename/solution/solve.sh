#!/usr/bin/env bash
set -e
sed -n 's/^port *= *//p' /etc/shop/settings.ini > /app/port.txt
