#!/bin/sh
# SECRET-ANSWER: the build number is 4711 (this script is deleted by the image).
echo "build=4711" > /etc/build-info
