#!/usr/bin/env bash
# A long soak of one real flatkv-server (not in CI): mixed puts, gets,
# appends, removes, batches, scans and string keys from 16 connections, with
# write-mode switches and compactions, for MINUTES (default 30). RSS, open
# descriptors and disk usage are sampled every 5 s into OUT/soak.csv and
# drawn in OUT/soak.png (python3-matplotlib). Exits 1, saying why, if a call
# failed or read a wrong value, if after the warm-up RSS or descriptors left
# +-10 % of their median, or if the disk passed 2x the live data
# (deploy/soak.py has the details).
# Usage: bash deploy/soak.sh [MINUTES] [OUT]   (OUT defaults to soak-<date>)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
out=${2:-soak-$(date -u +%Y%m%d-%H%M%S)}
if [[ ! -x build/server/flatkv-server ]] || ! /usr/bin/python3 -c "import matplotlib, thrift" 2>/dev/null; then
  bash deploy/install-deps.sh
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build build -j "$(nproc)"
fi
exec /usr/bin/python3 deploy/soak.py build/server/flatkv-server "$(command -v thrift)" \
  thrift/flatkv.thrift "$out" "$minutes"
