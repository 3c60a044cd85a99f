#!/usr/bin/env bash
ls /sys/class/net | sort > /app/interfaces.txt
