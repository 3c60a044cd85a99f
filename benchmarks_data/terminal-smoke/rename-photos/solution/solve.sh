#!/usr/bin/env bash
set -e
cd "${APP_DIR:-/app}/photos"
for f in IMG_*.JPG; do
  n="${f#IMG_}"
  mv -- "$f" "photo-${n%.JPG}.jpg"
done
