#!/usr/bin/env bash
echo ready > /app/status.txt
