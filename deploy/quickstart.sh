#!/usr/bin/env bash
# Installs dependencies, builds FlatKV and starts a single-node flatkv-server
# on defaults (the README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target flatkv-server

# A single-node server on defaults: 127.0.0.1:9901, data under ./data.
# Stop it with Ctrl-C (or SIGTERM): it flushes and closes cleanly.
exec ./build/server/flatkv-server
