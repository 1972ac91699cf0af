#!/usr/bin/env bash
# Installs every Debian package FlatKV's build, tests and benchmark need.
# Idempotent: packages already present are skipped by apt; safe to run twice.
# Usage (as root on Debian 12): bash deploy/install-deps.sh
set -euo pipefail

packages=(
  # build
  cmake g++ make pkg-config ninja-build
  # server and cluster (Thrift needs Boost headers it does not depend on)
  thrift-compiler libthrift-dev libboost-dev libevent-dev
  libzookeeper-mt-dev zookeeper
  # ZooKeeper digest ACL ids (SHA-1, base64), token comparison and TLS on
  # the ports: OpenSSL (libevent-dev brings libevent_openssl); the TLS tests
  # make their certificates with the openssl command
  libssl-dev openssl
  libspdlog-dev libyaml-cpp-dev
  # flatkv-server's allocator (server/CMakeLists.txt says why)
  libjemalloc-dev
  # the documented 64-bit hash of string keys (XXH64)
  libxxhash-dev
  # CRC32C of records of 256 bytes and more (engine/crc32c.h)
  libisal-dev
  # the engine's sparse tier keeps its keys' order in Abseil's B-tree
  # (engine/sparse_tier.h)
  libabsl-dev
  # tests (the full-disk tests make and loop-mount a small ext4 file system)
  catch2 python3 python3-thrift strace e2fsprogs mount
  # deploy/soak.sh draws its samples, client/bench/bench_report.py --plot its
  # growth charts (ctest bench_report_plot fails without it)
  python3-matplotlib
  # fuzzing (tests/fuzz, deploy/fuzz.sh): clang 14, its libFuzzer, and the
  # sanitizer runtimes (libclang-rt-14-dev is only recommended by clang, so
  # --no-install-recommends leaves it out and -fsanitize=fuzzer,address
  # cannot link)
  clang libfuzzer-14-dev libclang-rt-14-dev
  # the operator console's test in a real browser (tests/integration/
  # console_browser_test.py): headless Chromium driven by chromedriver
  chromium chromium-driver python3-selenium
  # ring tests: ZooKeeper from Python, and XXH64 to know each string key's owner
  python3-kazoo python3-xxhash
  # the Python package client/python: pip-installed into a venv that sees
  # Debian's packages (built offline with setuptools and wheel), tested with
  # pytest (ctest python_client_*); its source archive made by python3 -m
  # build (ctest python_client_sdist)
  python3-venv python3-setuptools python3-wheel python3-pytest python3-build
  # the fault-injection suite (tests/jepsen): network namespaces and a bridge
  # (iproute2), links cut inside a namespace (nftables), one member's
  # wall clock stepped or slowed (faketime); its checker is built with the Go
  # toolchain below
  nftables faketime iproute2
  # peer engines for flatkv-bench
  librocksdb-dev libleveldb-dev libkyotocabinet-dev
  # the server against Redis: flatkv-loadgen's hiredis client and the Redis
  # it is measured against (client/bench/loadgen_vs_redis.sh, bench_vs_redis.sh,
  # ctest loadgen_smoke). On a machine with systemd the package also starts
  # Debian's redis-server service on 127.0.0.1:6379; nothing here uses it.
  libhiredis-dev redis-server redis-tools
  # client examples in Java and Go, and the YCSB binding (client/examples,
  # client/ycsb): Maven and Go fetch libthrift 0.17.0 / YCSB 0.17.0 and the
  # Go module github.com/apache/thrift v0.17.0 on the first build
  maven default-jdk-headless golang-go
  # the Debian package (cpack -G DEB: dpkg-shlibdeps) and its test
  # (systemd-analyze verify, deb-systemd-helper, useradd)
  dpkg-dev systemd init-system-helpers passwd
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
