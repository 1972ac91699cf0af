#!/usr/bin/env bash
# Installs dependencies, builds FlatKV and runs the engine benchmark against
# the peer engines on this machine (the README's first command). Until
# flatkv-server exists, this is how a new user sees FlatKV run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"

dir=$(mktemp -d /tmp/flatkv-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
for engine in flat rocksdb leveldb kyotocabinet; do
  ./build/client/flatkv-bench engine --engine "$engine" \
    --workload fillrandom,overwrite,readrandom,readmissing,deleterandom \
    --num 500000 --value-size 100 --threads 1 --dir "$dir/$engine" --fresh
done
