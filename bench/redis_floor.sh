#!/usr/bin/env bash
# bench/redis_floor.sh - what redis-server itself costs in cluster mode, with no broker at all
# (docs/performance.md#redis-cluster): the floor the broker's Redis-side overhead on a 1-shard
# cluster (bench/cluster.sh) is read against. Two redis-servers on free loopback ports, no
# persistence:
#   standalone  a plain redis-server
#   cluster-1   a cluster-enabled redis-server owning all 16 384 slots (ADDSLOTSRANGE 0 16383),
#               the cluster-1 configuration of bench/cluster.sh
# redis-benchmark drives each in turn with the same work, pipelined (-P) over -r keys:
#   eval  a script shaped like Shoal's hot path: an XADD capped by MAXLEN on KEYS[1] and a
#         second key of the same hash tag, as a publish script writes an address's stream and
#         its other keys ({a:<address>}), SCRIPT below
#   set, get  plain commands, for comparison
# Each repetition runs every workload against standalone, then cluster-1 (after one uncounted
# warm-up round), so both see the same machine over the same minutes. Printed per workload,
# medians over the repetitions: redis-server CPU µs per command (utime+stime from
# /proc/PID/stat over the run, as bench/cluster.sh takes it) and requests per second in each
# mode, and cluster-1's CPU over standalone's; then each repetition's ratio.
#
# usage: bench/redis_floor.sh [OUTDIR]   (or: make bench-redis-floor; QUICK=1 for a short check)
#
# Environment (defaults in brackets; QUICK=1 changes them to the second value):
#   N          commands per run                                    [300000 | 20000]
#   REPS       measured repetitions (median reported)              [5 | 1]
#   WARMUP     commands per workload of the uncounted first round  [30000 | 2000]
#   PIPELINE   redis-benchmark -P: commands per pipeline           [16]
#   KEYSPACE   redis-benchmark -r: how many keys {a:<n>}:s          [16]
#   CLIENTS    redis-benchmark -c: connections                     [50]
#   WORKLOADS  which of eval, set, get                             ["eval set get"]
#   SCRIPT     the eval workload's Lua (KEYS[1] is {a:<n>}:s)       [XADD MAXLEN 100, then INCR]
#   RUN_TIMEOUT  seconds per redis-benchmark run                   [300]
# Needs redis-server and redis-benchmark (Debian's redis-tools, installed with redis-server) and
# python3 (free ports); no broker and no venv. Loopback only; bounded by N and RUN_TIMEOUT; both
# redis-servers are stopped by PID on exit.
set -euo pipefail

# no broker here: lib.sh need not make the broker's .venv-bench, and free_ports needs only python3
BROKER_PY=${BROKER_PY:-none}
[[ -x ${PY:-$(dirname "$0")/../.venv/bin/python} ]] || PY=$(command -v python3)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
if [[ ${QUICK:-0} == 1 ]]; then N=${N:-20000}; REPS=${REPS:-1}; WARMUP=${WARMUP:-2000}; fi
N=${N:-300000}; REPS=${REPS:-5}; WARMUP=${WARMUP:-30000}; PIPELINE=${PIPELINE:-16}
KEYSPACE=${KEYSPACE:-16}; CLIENTS=${CLIENTS:-50}; RUN_TIMEOUT=${RUN_TIMEOUT:-300}
SCRIPT=${SCRIPT:-"redis.call('xadd', KEYS[1], 'MAXLEN', '100', '*', 'a', 'b'); return redis.call('incr', KEYS[1]..'c')"}
read -r -a WORKLOADS <<< "${WORKLOADS:-eval set get}"
OUT=${1:-/tmp/shoal-bench/redis-floor-$(date +%Y%m%d-%H%M%S)}

for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" > /dev/null || { echo "$tool missing (make system-deps)" >&2; exit 2; }
done
for workload in "${WORKLOADS[@]}"; do
  case $workload in eval | set | get) ;; *)
    echo "unknown workload '$workload' (eval, set, get)" >&2; exit 2 ;;
  esac
done

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/shoal-bench-redis-floor.XXXXXX)
CLEANUP_MESSAGE="stopped everything started; results in $OUT"
stop_on_exit
RESULTS=$OUT/results.txt
: > "$RESULTS"

NAMES=(standalone cluster-1)
declare -a PORTS PIDS

read -r port < <(free_ports 1)
mkdir -p "$OUT/standalone"
start_redis "$port" "$OUT/standalone" --appendonly no
PORTS[0]=$port; PIDS[0]=$REDIS_PID

read -r port bus < <(free_ports 2)
mkdir -p "$OUT/cluster-1"
start_redis "$port" "$OUT/cluster-1" --appendonly no --cluster-enabled yes \
    --cluster-config-file nodes.conf --cluster-port "$bus"
PORTS[1]=$port; PIDS[1]=$REDIS_PID
timeout 10 redis-cli -h 127.0.0.1 -p "$port" CLUSTER ADDSLOTSRANGE 0 16383 | grep -q OK \
  || { echo "the cluster-enabled redis-server refused ADDSLOTSRANGE" >&2; exit 1; }
for ((t = 0; t < 100; t++)); do
  timeout 10 redis-cli -h 127.0.0.1 -p "$port" CLUSTER INFO | tr -d '\r' \
    | grep -qx 'cluster_state:ok' && break
  sleep 0.1
done
((t < 100)) || { echo "the one-node cluster did not reach cluster_state:ok" >&2; exit 1; }

{
  echo "before: $(date -Is) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "N=$N REPS=$REPS WARMUP=$WARMUP PIPELINE=$PIPELINE KEYSPACE=$KEYSPACE CLIENTS=$CLIENTS" \
       "WORKLOADS=${WORKLOADS[*]}"
  echo "SCRIPT=$SCRIPT"
  echo "redis: $(redis-server --version)"
  echo "standalone pid ${PIDS[0]} port ${PORTS[0]}; cluster-1 pid ${PIDS[1]} port ${PORTS[1]}"
} | tee "$OUT/machine.txt"

measure() {  # measure CONFIG WORKLOAD REP COUNT: one redis-benchmark run; a line in RESULTS
  # unless REP is 0
  local c=$1 workload=$2 rep=$3 n=$4 c0 c1 k0 k1 status=0
  local -a what
  case $workload in
    eval) what=(EVAL "$SCRIPT" 1 '{a:__rand_int__}:s') ;;
    set | get) what=(-t "$workload") ;;
  esac
  c0=$(proc_cpu_s "${PIDS[c]}")
  k0=$(cpu_ticks)
  # in the background and waited for, so a TERM or INT stops the run at once
  timeout -k 5 "$RUN_TIMEOUT" redis-benchmark -h 127.0.0.1 -p "${PORTS[c]}" -n "$n" \
      -P "$PIPELINE" -r "$KEYSPACE" -c "$CLIENTS" --csv "${what[@]}" > "$WORK/bench.out" 2>&1 &
  STARTED_PIDS+=("$!")
  wait "$!" || status=$?
  unset 'STARTED_PIDS[-1]'
  cat "$WORK/bench.out" >> "$OUT/log.txt"
  ((status == 0)) || {
    echo "redis-benchmark failed on ${NAMES[c]} ($workload, exit status $status):" \
         "$(tail -n1 "$WORK/bench.out")" >&2
    exit 1
  }
  c1=$(proc_cpu_s "${PIDS[c]}")
  k1=$(cpu_ticks)
  ((rep == 0)) && return 0
  # the CSV's second line: "<test>","<rps>",...; a test name holds no '","'
  awk -F'","' -v c="$c" -v w="$workload" -v rep="$rep" -v n="$n" -v c0="$c0" -v c1="$c1" \
      -v share="$(machine_share "$k0" "$k1")" \
      'NR == 2 { split(share, m); printf "%d %s %d %.3f %.0f %.0f\n", c, w, rep,
                 1e6 * (c1 - c0) / n, $2, m[1] }' "$WORK/bench.out" | tee -a "$RESULTS"
}

for ((rep = 0; rep <= REPS; rep++)); do  # rep 0 warms both servers up and is not counted
  n=$N; ((rep == 0)) && n=$WARMUP
  echo "--- rep $rep: $n commands per run"
  for workload in "${WORKLOADS[@]}"; do
    for c in 0 1; do measure "$c" "$workload" "$rep" "$n"; done
  done
done
echo "after: $(date -Is) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"

echo
echo "## redis-server in cluster mode against standalone, medians of $REPS ($(nproc) cores," \
     "$N commands per run, -P $PIPELINE, -r $KEYSPACE, -c $CLIENTS)"
echo
python3 - "$RESULTS" "${WORKLOADS[@]}" <<'EOF' | tee "$OUT/table.md"
import statistics
import sys

path, workloads = sys.argv[1], sys.argv[2:]
rows = [line.split() for line in open(path) if line.strip()]
by = {(int(r[0]), r[1], r[2]): r for r in rows}
print('| workload | standalone µs/command | cluster-1 µs/command | cluster-1 over standalone, CPU'
      ' | standalone commands/s | cluster-1 commands/s | machine busy % |')
print('|---|---|---|---|---|---|---|')
for w in workloads:
    reps = sorted({k[2] for k in by if k[1] == w and (0, w, k[2]) in by and (1, w, k[2]) in by})
    if not reps:
        print(f'| {w} | no result | | | | | |')
        continue
    cpu = [statistics.median(float(by[c, w, k][3]) for k in reps) for c in (0, 1)]
    rate = [statistics.median(float(by[c, w, k][4]) for k in reps) for c in (0, 1)]
    busy = statistics.median(float(by[c, w, k][5]) for k in reps for c in (0, 1))
    over = f'{100 * (cpu[1] / cpu[0] - 1):+.1f} %' if cpu[0] else '-'
    print(f'| {w} | {cpu[0]:.2f} | {cpu[1]:.2f} | {over} '
          f'| {rate[0]:,.0f} | {rate[1]:,.0f} | {busy:.0f} |')
print()
for w in workloads:
    reps = sorted({k[2] for k in by if k[1] == w and (0, w, k[2]) in by and (1, w, k[2]) in by})
    ratios = [(float(by[1, w, k][3]), float(by[0, w, k][3])) for k in reps]
    print(f'{w}, cluster-1 over standalone per repetition: '
          + ', '.join(f'{100 * (a / b - 1):+.1f} %' if b else '-' for a, b in ratios))
EOF
echo "per run (config workload rep cpu-us/command commands/s busy%; config 0 standalone, 1" \
     "cluster-1):"
cat "$RESULTS"
