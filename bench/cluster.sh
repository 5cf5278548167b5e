#!/usr/bin/env bash
# bench/cluster.sh - Redis Cluster against standalone Redis on the same machine, in the same run
# (docs/performance.md#redis-cluster). Each configuration has redis-servers of its own and one
# Shoal broker, on free loopback ports:
#   standalone  one redis-server, a redis:// URL
#   cluster-1   one cluster-enabled redis-server owning all 16 384 slots (ADDSLOTSRANGE 0 16383;
#               `redis-cli --cluster create` wants three primaries)
#   cluster-2   two primaries, the slots in halves; cluster-3: three, in thirds (each node takes
#               its range with ADDSLOTSRANGE, then CLUSTER MEET joins them; bench/slots.py ranges)
# Each is started by bench/redis_cluster.sh's cluster_up, as bench/matrix.sh starts its own.
# The clusters have no replicas: what is measured is CPU per message, and a replica would only
# add its primary's replication stream and a process of its own to the machine.
#
# All configurations run at once; each repetition runs the same bench/load.py row against each
# in turn (A B C D A B C D ...), after one warm-up run each that is not counted: 1 producer ->
# 1 consumer, at-least-once, closed loop (--max-backlog), spread over ADDRESSES addresses
# (--addresses) whose names fall evenly on 2 and 3 shards (bench/slots.py pick). Printed per
# configuration, medians over the repetitions: msg/s, broker CPU µs per message, Redis CPU µs
# per message summed over its redis-servers and per shard (each shard's CPU over the messages
# its addresses carried), Redis commands per message (INFO stats, all shards), pipelines per
# message (broker /metrics; on a cluster each node's pipeline counts), the machine's busy
# share; then the 1-shard cluster's overhead per message against standalone, broker and Redis
# side. CPU is utime+stime from /proc/PID/stat over each run, as bench/cpu.sh takes it. What
# redis-server itself costs in cluster mode, with no broker: bench/redis_floor.sh.
#
# usage: bench/cluster.sh [OUTDIR]      (or: make bench-cluster; QUICK=1 for a short check)
#
# Environment (defaults in brackets; QUICK=1 changes them to the second value):
#   N          messages per run                                    [100000 | 4000]
#   REPS       measured repetitions (median reported)              [3 | 1]
#   WARMUP     messages of the uncounted first run                 [5000 | 1000]
#   ADDRESSES  addresses the row is spread over                    [16]
#   BACKLOG    closed loop: max sent-but-not-received              [1000]
#   SIZE       body bytes                                          [1024]
#   CONFIGS    the configurations, standalone and shard counts     ["standalone 1 2 3"]
#   RUN_TIMEOUT  seconds per load process per run                  [120]
#   BROKER_SRC a broker/ source tree to measure instead of this checkout's, first on the
#              broker's PYTHONPATH as bench/cpu.sh does (e.g. `git archive BRANCH broker | tar -x
#              -C /tmp/tree` and BROKER_SRC=/tmp/tree/broker)                      [none]
#   PY, BROKER_PY as in bench/lib.sh
# A configuration whose cluster does not form, whose broker does not become ready or whose run
# fails is reported with the reason and left out of the later runs; the others go on, and the
# exit status is 1. Loopback only; every process started is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=bench/redis_cluster.sh
. "$HERE/redis_cluster.sh"
if [[ ${QUICK:-0} == 1 ]]; then N=${N:-4000}; REPS=${REPS:-1}; WARMUP=${WARMUP:-1000}; fi
N=${N:-100000}; REPS=${REPS:-3}; WARMUP=${WARMUP:-5000}; ADDRESSES=${ADDRESSES:-16}
BACKLOG=${BACKLOG:-1000}; SIZE=${SIZE:-1024}; RUN_TIMEOUT=${RUN_TIMEOUT:-120}
read -r -a CONFIGS <<< "${CONFIGS:-standalone 1 2 3}"
OUT=${1:-/tmp/shoal-bench/cluster-$(date +%Y%m%d-%H%M%S)}

"$PY" -c 'import proton, cproton_ffi, redis, shoal_broker' 2>/dev/null || {
  echo "$PY lacks python-qpid-proton, redis or shoal_broker (run 'make venv')" >&2; exit 2; }
"$BROKER_PY" -c 'import shoal_broker.amqp._wire' 2>/dev/null || {
  echo "the broker's interpreter $BROKER_PY cannot import shoal_broker (see lib.sh)" >&2; exit 2; }
for tool in redis-server redis-cli curl; do
  command -v "$tool" > /dev/null || { echo "$tool missing (make system-deps)" >&2; exit 2; }
done
((ADDRESSES >= 3)) || { echo "ADDRESSES must be at least 3 (one per shard)" >&2; exit 2; }
if [[ -n ${BROKER_SRC:-} ]]; then
  BROKER_SRC=$(cd "$BROKER_SRC" && pwd)
  build_wire "$BROKER_SRC"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/shoal-bench-cluster.XXXXXX)
CLEANUP_MESSAGE="stopped everything started; results in $OUT"
stop_on_exit

# Per configuration (index c): its name, shard count (0: standalone), redis-server PIDs and
# ports, the broker's URL, PID and ports, and why it is out of the run (empty: still in).
declare -a NAME SHARDS NODE_PIDS NODE_PORTS URL BPID APORT HPORT FAILED
RESULTS=$OUT/results.txt
: > "$RESULTS"

rcli() { timeout 10 redis-cli -h 127.0.0.1 -p "$@"; }

metric() {  # sum of a Prometheus counter from the broker's /metrics (0 when it has none)
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^"m { s += $2 } END { print s + 0 }'
}

stop_pids() {  # stop_pids PID...: stop these now, in this order (lib.sh's stop_started), and
  # drop them from STARTED_PIDS: the exit's clean-up must not signal a PID perhaps reused since
  local all=("${STARTED_PIDS[@]}") gone=" $* " pid
  STARTED_PIDS=("$@")
  stop_started || true
  STARTED_PIDS=()
  for pid in "${all[@]}"; do [[ $gone == *" $pid "* ]] || STARTED_PIDS+=("$pid"); done
}

fail() {  # fail CONFIG REASON: the configuration leaves the run, says why, and its processes
  # stop now rather than at exit (a broker stuck retrying would take CPU from the others' runs)
  FAILED[$1]=$2
  echo "FAILED ${NAME[$1]}: $2" | tee -a "$OUT/failures.txt" >&2
  # shellcheck disable=SC2086  # PIDs are words
  stop_pids ${BPID[$1]:-} ${NODE_PIDS[$1]:-}
}

redis_commands() {  # commands the given redis-servers have processed so far, summed
  local port sum=0 n
  for port in "$@"; do
    n=$(rcli "$port" INFO stats | tr -d '\r' | awk -F: '$1 == "total_commands_processed" { print $2 }')
    sum=$((sum + ${n:-0}))
  done
  echo "$sum"
}

start_config_broker() {  # start_config_broker CONFIG: 0 once /readyz answers; 1 if the broker
  # exits or is not ready in 30 s
  local c=$1 log=$OUT/${NAME[$1]}/broker.log aport hport t source=()
  read -r aport hport < <(free_ports 2)
  APORT[c]=$aport; HPORT[c]=$hport
  [[ -n ${BROKER_SRC:-} ]] && source=("PYTHONPATH=$BROKER_SRC")
  env "${source[@]}" SHOAL_LOG_LEVEL=WARNING "$BROKER_PY" -m shoal_broker \
      --listen "127.0.0.1:$aport" --http "127.0.0.1:$hport" --redis-url "${URL[c]}" \
      --replica-id "bench-${NAME[c]}" > "$log" 2>&1 &
  BPID[c]=$!; STARTED_PIDS+=("${BPID[c]}")
  for ((t = 0; t < 300; t++)); do
    curl -sf "http://127.0.0.1:$hport/readyz" > /dev/null 2>&1 && return 0
    kill -0 "${BPID[c]}" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

broker_said() {  # the broker log's first error line, else its last line
  local log=$OUT/${NAME[$1]}/broker.log
  { grep -m1 -E 'Error|ERROR|CRITICAL|refuse' "$log" || tail -n1 "$log"; } 2>/dev/null | cut -c1-300
}

start_config() {  # start_config CONFIG: Redis (a server or a cluster, redis_cluster.sh's
  # cluster_up: SHARDS 0 is one plain redis-server), then the broker
  local c=$1 status=0
  mkdir -p "$OUT/${NAME[c]}"
  cluster_up "${SHARDS[c]}" "$OUT/${NAME[c]}" || status=$?
  # the nodes are this configuration's from now on: cluster_up's globals serve the next one
  NODE_PIDS[c]="${CLUSTER_PIDS[*]}"; NODE_PORTS[c]="${CLUSTER_PORTS[*]}"; URL[c]=$CLUSTER_URL
  CLUSTER_PIDS=(); CLUSTER_PORTS=(); CLUSTER_URL=""
  if ((status != 0)); then
    if ((SHARDS[c] == 0)); then
      fail "$c" "redis-server did not start"
    else
      fail "$c" "the cluster did not form (see $OUT/${NAME[c]}/node-*/redis.log)"
    fi
    return 0
  fi
  if start_config_broker "$c"; then
    echo "${NAME[c]}: broker pid ${BPID[c]} on ${URL[c]} (redis-server pids ${NODE_PIDS[c]})"
  else
    fail "$c" "the broker did not become ready: $(broker_said "$c")"
  fi
}

measure() {  # measure CONFIG REP PREFIX COUNT: one load run; a line in RESULTS unless REP is 0
  local c=$1 rep=$2 prefix=$3 n=$4 pid b0 b1 p0 p1 q0 q1 k0 k1 out rate served status why
  local -a pids ports r0=() r1=()
  read -r -a pids <<< "${NODE_PIDS[c]}"
  read -r -a ports <<< "${NODE_PORTS[c]}"
  b0=$(proc_cpu_s "${BPID[c]}")
  for pid in "${pids[@]}"; do r0+=("$(proc_cpu_s "$pid")"); done
  p0=$(metric "${HPORT[c]}" shoal_redis_pipeline_seconds_count)
  q0=$(redis_commands "${ports[@]}")
  k0=$(cpu_ticks)
  # in the background and waited for, so a TERM or INT stops the run at once (the clean-up
  # stops the load with everything else); out of STARTED_PIDS again once it has ended
  timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/load.py" run --port "${APORT[c]}" \
      --timeout "$RUN_TIMEOUT" -a "$prefix" --addresses "$ADDRESSES" -n "$n" --size "$SIZE" \
      --max-backlog "$BACKLOG" --label "${NAME[c]} rep $rep" \
      --json "$OUT/${NAME[c]}/load.jsonl" > "$WORK/load.out" 2>&1 &
  STARTED_PIDS+=("$!")
  status=0
  wait "$!" || status=$?
  unset 'STARTED_PIDS[-1]'
  out=$(< "$WORK/load.out")
  ((status == 0)) || {
    echo "$out" >> "$OUT/log.txt"
    why=$({ grep -m1 -o 'INCOMPLETE: .*' <<< "$out" || tail -n1 <<< "$out"; } | cut -c1-300)
    if ! kill -0 "${BPID[c]}" 2>/dev/null; then
      why="$why; the broker exited: $(broker_said "$c")"
    elif grep -qE 'ERROR|CRITICAL' "$OUT/${NAME[c]}/broker.log"; then
      why="$why; the broker logged: $(broker_said "$c")"
    fi
    fail "$c" "the load run of rep $rep failed (exit status $status): $why"
    return 0
  }
  k1=$(cpu_ticks)
  b1=$(proc_cpu_s "${BPID[c]}")
  for pid in "${pids[@]}"; do r1+=("$(proc_cpu_s "$pid")"); done
  p1=$(metric "${HPORT[c]}" shoal_redis_pipeline_seconds_count)
  q1=$(redis_commands "${ports[@]}")
  echo "$out" >> "$OUT/log.txt"
  ((rep == 0)) && return 0
  rate=$(load_field "$OUT/${NAME[c]}/load.jsonl" msgs_per_s)
  served=$ADDRESSES
  ((SHARDS[c] > 0)) && served=$("$PY" "$HERE/slots.py" spread "$prefix" "$ADDRESSES" "${SHARDS[c]}")
  # per shard: its CPU over the messages its addresses carried (the load deals them out evenly)
  awk -v c="$c" -v rep="$rep" -v n="$n" -v k="$ADDRESSES" -v rate="${rate:-0}" \
      -v b="$(echo "${b1} - ${b0}" | bc)" -v p="$(echo "${p1} - ${p0}" | bc)" -v q=$((q1 - q0)) \
      -v r0="${r0[*]}" -v r1="${r1[*]}" -v served="$served" -v share="$(machine_share "$k0" "$k1")" \
      'BEGIN { split(r0, a); split(r1, z); split(served, s); split(share, m); total = 0
        per = ""; spread = ""
        for (i = 1; i <= length(a); i++) {
          cpu = z[i] - a[i]; total += cpu; msgs = n * s[i] / k
          per = per (i > 1 ? "/" : "") (msgs > 0 ? sprintf("%.1f", 1e6 * cpu / msgs) : "-")
          spread = spread (i > 1 ? "/" : "") s[i] }
        printf "%d %d %.0f %.1f %.1f %.3f %.0f %s %s %.2f\n", c, rep, rate, 1e6 * b / n,
          1e6 * total / n, p / n, m[1], per, spread, q / n }' \
    | tee -a "$RESULTS"
}

{
  echo "before: $(date -Is) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "N=$N REPS=$REPS WARMUP=$WARMUP ADDRESSES=$ADDRESSES BACKLOG=$BACKLOG SIZE=$SIZE" \
       "CONFIGS=${CONFIGS[*]}"
  echo "redis: $(redis-server --version)"
  echo "broker on $BROKER_PY${BROKER_SRC:+ from $BROKER_SRC}, clients on $PY"
  echo "shoal: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" \
       status --porcelain -- broker 2>/dev/null | grep -q . && echo ' (broker/ modified)')"
} | tee "$OUT/machine.txt"

i=0
for config in "${CONFIGS[@]}"; do
  case $config in
    standalone) NAME[i]=standalone; SHARDS[i]=0 ;;
    [1-9]) NAME[i]=cluster-$config; SHARDS[i]=$config ;;
    *) echo "unknown configuration '$config' (standalone, or a shard count 1-9)" >&2; exit 2 ;;
  esac
  FAILED[i]=""
  start_config "$i"
  echo "${NODE_PIDS[i]:-} ${BPID[i]:-}" >> "$OUT/pids.txt"  # for a check afterwards: none is left
  i=$((i + 1))
done

shard_counts=()
for ((c = 0; c < ${#NAME[@]}; c++)); do ((SHARDS[c] > 1)) && shard_counts+=("${SHARDS[c]}"); done
for ((rep = 0; rep <= REPS; rep++)); do  # rep 0 warms every configuration up and is not counted
  # the same addresses for every configuration of a repetition, fresh ones for the next
  prefix=$("$PY" "$HERE/slots.py" pick "cl$rep" "$ADDRESSES" 1 "${shard_counts[@]}")
  n=$N; ((rep == 0)) && n=$WARMUP
  echo "--- rep $rep: $n messages over $ADDRESSES addresses $prefix-0 ... $prefix-$((ADDRESSES - 1))"
  for ((c = 0; c < ${#NAME[@]}; c++)); do
    [[ -z ${FAILED[c]} ]] && measure "$c" "$rep" "$prefix" "$n"
  done
done
echo "after: $(date -Is) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"

names=$(IFS=,; echo "${NAME[*]}")
echo
echo "## Redis Cluster against standalone, medians of $REPS ($(nproc) cores, $N messages" \
     "over $ADDRESSES addresses per run)"
echo
"$PY" - "$RESULTS" "$names" <<'EOF' | tee "$OUT/table.md"
import statistics
import sys

path, names = sys.argv[1], sys.argv[2].split(',')
rows = [line.split() for line in open(path) if line.strip()]


def med(values):
    return statistics.median(values) if values else None


def shown(value):
    return '-' if value is None else f'{value:.1f}'


print('| configuration | msg/s | broker µs/msg | Redis µs/msg, all shards | Redis µs per message'
      ' served, per shard | addresses per shard | Redis commands/msg | pipelines/msg'
      ' | machine busy % |')
print('|---|---|---|---|---|---|---|---|---|')
medians = {}
for c, name in enumerate(names):
    mine = [r for r in rows if int(r[0]) == c]
    if not mine:
        print(f'| {name} | no result | | | | | | | |')
        continue
    rate, broker, redis, pipelines, busy = (med([float(r[i]) for r in mine]) for i in range(2, 7))
    commands = med([float(r[9]) for r in mine])
    shards = [r[7].split('/') for r in mine]
    per_shard = '/'.join(
        shown(med([float(s[i]) for s in shards if s[i] != '-'])) for i in range(len(shards[0]))
    )
    medians[name] = broker, redis
    # a broker that counts no pipelines (shoal_redis_pipeline_seconds; a BROKER_SRC tree whose
    # cluster lanes do not) shows none, not zero
    pipelines_shown = f'{pipelines:.3f}' if pipelines else '-'
    spreads = ', '.join(dict.fromkeys(r[8] for r in mine))  # each repetition's names split anew
    print(f'| {name} | {rate:,.0f} | {broker:.1f} | {redis:.1f} | {per_shard} | {spreads} '
          f'| {commands:.2f} | {pipelines_shown} | {busy:.0f} |')
print()
if 'standalone' in medians and 'cluster-1' in medians:
    (b0, r0), (b1, r1) = medians['standalone'], medians['cluster-1']
    print(f'cluster of 1 shard against standalone, per message: broker {100 * (b1 / b0 - 1):+.1f} %,'
          f' Redis {100 * (r1 / r0 - 1):+.1f} % (issue 23 asks for at most +10 %)')
    # the two runs of one repetition are adjacent: their ratios show how much the medians' moves
    by = {(names[int(r[0])], r[1]): r for r in rows}
    both = sorted({r[1] for r in rows if ('standalone', r[1]) in by and ('cluster-1', r[1]) in by})
    for column, what in ((3, 'broker'), (4, 'Redis')):
        ratios = [float(by['cluster-1', k][column]) / float(by['standalone', k][column]) for k in both]
        print(f'  {what}, per repetition: ' + ', '.join(f'{100 * (v - 1):+.1f} %' for v in ratios))
else:
    print('cluster of 1 shard against standalone: not measured (a configuration has no result)')
EOF
echo "per run (config rep msg/s broker-us redis-us pipelines/msg busy% per-shard-us addresses" \
     "redis-commands/msg):"
cat "$RESULTS"
# brokers first, while their Redis is still there to leave cleanly; Redis at exit
# shellcheck disable=SC2046,SC2086  # PIDs are words
stop_pids $(for ((c = 0; c < ${#NAME[@]}; c++)); do [[ -z ${FAILED[c]} ]] && echo ${BPID[c]:-}; done)
errs=$(grep -c -E 'ERROR|CRITICAL|Traceback' "$OUT"/*/broker.log 2>/dev/null || true)
echo "broker log lines with ERROR/CRITICAL/Traceback: $(echo "$errs" | tr '\n' ' ')"
if [[ -s $OUT/failures.txt ]]; then
  echo "failed configurations:" >&2
  cat "$OUT/failures.txt" >&2
  exit 1
fi
