#!/usr/bin/env bash
# Loads and runs one YCSB workload against a FlatKV server (or Redis) and
# prints YCSB's summary of both phases.
#
#   client/ycsb/run.sh HOST:PORT WORKLOAD [RECORDS OPS THREADS]
#
# WORKLOAD is a file or a name in client/ycsb/workloads/ (workloada..f, and
# the ZDB paper's Table 1 mixes writeonly-1k, readheavy-1k, writeheavy-1k and
# their -4k twins). RECORDS (100000), OPS (100000) and THREADS (8) override
# the workload's recordcount, operationcount and YCSB's -threads; YCSB makes
# one connection per thread.
#
# Environment:
#   FLATKV_YCSB_DB=flatkv|redis   the binding (flatkv); redis for a Redis
#                                 server at HOST:PORT, the same workload
#   FLATKV_YCSB_KEYS=int|string   FlatKV key mode (int: "user<N>" is key N,
#                                 inserted in order; string: sput/sget)
#   FLATKV_YCSB_BUILD=DIR         where the binding is built (CMake passes
#                                 build/client/ycsb; default client/ycsb/target,
#                                 built here with Maven when missing or stale)
#   YCSB_OPTS                     more YCSB arguments, e.g. "-p fieldlength=4096"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if (($# < 2)); then
  sed -n '2,23s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi
addr=$1 workload=$2 records=${3:-100000} ops=${4:-100000} threads=${5:-8}
host=${addr%:*} port=${addr##*:}
[[ -f "$workload" ]] || workload=$here/workloads/$workload
if [[ ! -f "$workload" ]]; then
  echo "run.sh: no workload $2 (a file, or one of: $(ls "$here/workloads" | tr '\n' ' '))" >&2
  exit 2
fi

out=${FLATKV_YCSB_BUILD:-$here/target}
jar=$out/flatkv-ycsb.jar
if [[ -z "${FLATKV_YCSB_BUILD:-}" ]] &&
   { [[ ! -f "$jar" ]] || [[ -n "$(find "$here/src" "$here/pom.xml" "$here/../../thrift/flatkv.thrift" -newer "$jar" -print -quit)" ]]; }; then
  echo "run.sh: building the binding (Maven) into $out" >&2
  mvn -B -q -Dstyle.color=never -f "$here/pom.xml" package -Dflatkv.out="$out" >&2
fi
[[ -f "$jar" ]] || { echo "run.sh: $jar is missing (build it first)" >&2; exit 2; }

args=(-P "$workload" -p recordcount="$records" -p operationcount="$ops" -threads "$threads")
case ${FLATKV_YCSB_DB:-flatkv} in
  flatkv)
    keys=${FLATKV_YCSB_KEYS:-int}
    args+=(-db site.ycsb.db.flatkv.FlatKVClient -p flatkv.host="$host" -p flatkv.port="$port"
           -p flatkv.keys="$keys")
    # Integer keys in insertion order fill FlatKV's segments in order;
    # hashed order would make user<N> span 2^63 keys.
    [[ "$keys" == int ]] && args+=(-p insertorder=ordered)
    ;;
  redis)
    args+=(-db site.ycsb.db.redis.RedisClient -p redis.host="$host" -p redis.port="$port") ;;
  *) echo "run.sh: FLATKV_YCSB_DB must be flatkv or redis" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206
args+=(${YCSB_OPTS:-})

# YCSB's progress goes to stderr (kept only on failure); its summary to stdout.
ycsb() {
  local phase=$1 flag=$2 log
  log=$(mktemp)
  echo "# $phase: $(basename "$workload"), $records records, $ops operations, $threads threads"
  if ! java -cp "$jar:$out/lib/*" site.ycsb.Client "$flag" "${args[@]}" 2>"$log"; then
    cat "$log" >&2
    rm -f "$log"
    echo "run.sh: YCSB's $phase phase failed" >&2
    exit 1
  fi
  grep -E '^(Error|flatkv:)' "$log" >&2 || true
  rm -f "$log"
}
ycsb load -load
ycsb run -t
