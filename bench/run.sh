#!/usr/bin/env bash
# bench/run.sh - the Shoal benchmark suite (make bench): one private redis-server, one Shoal
# broker, the rows below driven by bench/load.py, loopback only. docs/performance.md describes
# the rows and holds the current results.
#
# usage: bench/run.sh [OUTDIR]          (or: make bench; QUICK=1 make bench for a short check)
#
# Environment overrides (defaults in brackets; QUICK=1 changes the defaults to the second value):
#   N         messages per throughput run                          [50000 | 3000]
#   NFAN      messages per fan-out run (x 4 deliveries)            [20000 | 1000]
#   NLAT      messages per latency run                             [10000 | 1000]
#   RATE      latency-run rate, msg/s                              [1000]
#   REPS      repetitions per test (median reported)               [3 | 1]
#   WARMUP    messages of one discarded warm-up run before row i   [5000 | 500]
#   BACKLOG   closed loop: max sent-but-not-received               [1000]
#   SIZE      body bytes                                           [1024]
#   RUN_TIMEOUT  seconds per load process per repetition           [120]
#   ROWS      the rows to run                                      ["i ii iii v iv s d"]
#   PY        python with python-qpid-proton and Shoal installed   [.venv/bin/python]
#   BROKER_PY the broker's interpreter                             [.venv-bench/bin/python, lib.sh]
#
# bench/rabbitmq.sh runs the same rows (same labels, same options) against RabbitMQ, and
# bench/peers.sh interleaves the two.
#
# Fan-out: bench/load.py attaches its links with a bare address and no capabilities. Shoal
# auto-creates such an address as a *queue* (SHOAL_DEFAULT_ADDRESS_KIND=queue), and the four
# "subscribers" would then compete for one queue instead of each receiving every message. So
# the fan-out row runs against a second broker started (on the same Redis, after the first one
# is stopped) with SHOAL_DEFAULT_ADDRESS_KIND=topic: every address the row names is created as
# a topic, each consumer link gets its own non-durable subscription, and the row measures real
# topic fan-out (load.py checks that every subscriber got every message).
#
# Durable row: a second redis-server with appendonly yes + appendfsync always and a broker with
# SHOAL_DURABILITY=fsync (an accept means the message is fsynced), producers marking messages
# durable; it matches bench/rabbitmq.sh's "i-durable" row (durable queue, persistent messages).
# Shared row ("s"): a JMS shared durable subscription with 4 consumers over 2 replicas (a second
# broker on the same Redis), driven by bench/shared.py, which attaches the way Qpid JMS does;
# RabbitMQ 3.10 has no JMS shared subscriptions, so this row has no peer.
#
# Every load run is bounded by --timeout per process and each step by `timeout`. Every
# process this script starts is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
row_defaults
ROWS=" ${ROWS:-i ii iii v iv s d} "
OUT=${1:-/tmp/shoal-bench/$(date +%Y%m%d-%H%M%S)}

"$PY" -c 'import proton, cproton_ffi, shoal_broker' 2>/dev/null || {
  echo "$PY lacks python-qpid-proton or shoal_broker (run 'make venv')" >&2; exit 2; }
"$BROKER_PY" -c 'import shoal_broker.amqp._wire' 2>/dev/null || {
  echo "the broker's interpreter $BROKER_PY cannot import shoal_broker (see lib.sh)" >&2; exit 2; }
echo "broker on $BROKER_PY ($("$BROKER_PY" -c 'import sys; print(sys.version.split()[0])')), clients on $PY"
command -v redis-server > /dev/null || { echo "redis-server missing (make system-deps)" >&2; exit 2; }
command -v curl > /dev/null || { echo "curl missing" >&2; exit 2; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/shoal-bench-run.XXXXXX)     # private Redis directory
J="$OUT/results.jsonl"
: > "$J"  # this run's rows only: an OUTDIR used before must not add its runs to the medians
REDIS_PID=""
BROKER_PID=""

CLEANUP_MESSAGE="stopped everything started; results in $OUT"
stop_on_exit

# Five distinct free loopback ports (held open together so they differ).
read -r RPORT PORT HPORT PORT2 HPORT2 < <(free_ports 5)

machine() {  # one line of machine facts: when, cores, load, CPU pressure
  echo "$1: $(date -Is) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" \
       "cpu-pressure: $(head -1 /proc/pressure/cpu 2>/dev/null || echo n/a)"
}

start_redis() {  # extra redis-server options, e.g. --appendonly yes --appendfsync always
  local opts=(--appendonly no)
  (($#)) && opts=("$@")
  redis-server --bind 127.0.0.1 --port "$RPORT" --save '' "${opts[@]}" --dir "$WORK" \
      --protected-mode yes --logfile "$OUT/redis.log" --daemonize no > /dev/null 2>&1 &
  REDIS_PID=$!
  STARTED_PIDS+=("$REDIS_PID")
  local i
  for ((i = 0; i < 100; i++)); do
    redis-cli -h 127.0.0.1 -p "$RPORT" ping 2>/dev/null | grep -q PONG && return 0
    kill -0 "$REDIS_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "redis-server did not start; see $OUT/redis.log" >&2
  exit 1
}

start_broker() {  # $1: log file name; further args: extra environment (NAME=VALUE)
  local log=$1 i
  shift
  env SHOAL_LOG_LEVEL=WARNING "$@" "$BROKER_PY" -m shoal_broker --listen "127.0.0.1:$PORT" \
      --http "127.0.0.1:$HPORT" --redis-url "redis://127.0.0.1:$RPORT/0" --replica-id bench \
      > "$OUT/$log" 2>&1 &
  BROKER_PID=$!
  STARTED_PIDS+=("$BROKER_PID")
  for ((i = 0; i < 300; i++)); do
    curl -sf "http://127.0.0.1:$HPORT/readyz" > /dev/null 2>&1 && {
      echo "Shoal broker up: pid $BROKER_PID, amqp 127.0.0.1:$PORT, redis 127.0.0.1:$RPORT $*"
      return 0; }
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "Shoal broker did not become ready; see $OUT/$log" >&2
  exit 1
}

stop_broker() {  # SIGTERM, bounded wait, then SIGKILL
  local i
  kill -TERM "$BROKER_PID" 2>/dev/null || return 0
  for ((i = 0; i < 150; i++)); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$BROKER_PID" 2>/dev/null && { echo "broker ignored SIGTERM for 15 s; killing" >&2
                                         kill -KILL "$BROKER_PID"; }
  wait "$BROKER_PID" 2>/dev/null || true
}

FAILED=()
bench() {  # label, messages per rep (for the Redis CPU line), then bench/load.py run options
  local label=$1 per_rep=$2 r0 r1 msgs
  shift 2
  echo "--- $label"
  msgs=$((per_rep * REPS))
  [[ " $* " == *" --warmup "* ]] && msgs=$((msgs + WARMUP))
  r0=$(proc_cpu_s "$REDIS_PID")
  timeout -k 10 $(((REPS + 1) * (RUN_TIMEOUT + 25) + 60)) \
    "$PY" "$HERE/load.py" run --port "$PORT" --timeout "$RUN_TIMEOUT" \
      --reps "$REPS" --size "$SIZE" --broker-pid "$BROKER_PID" --label "shoal $label" \
      --json "$J" "$@" 2>&1 | tee -a "$OUT/log.txt" \
    || { echo "($label: incomplete or failed, see $OUT/log.txt)"; FAILED+=("$label"); }
  r1=$(proc_cpu_s "$REDIS_PID")
  awk -v l="$label" -v a="$r0" -v b="$r1" -v m="$msgs" 'BEGIN {
      printf "redis-server CPU | %s | %.1f s | %d msgs | %.1f us/msg\n", l, b - a, m, 1e6 * (b - a) / m }' \
    | tee -a "$OUT/redis-cpu.txt"
}

{
  machine "before"
  echo "N=$N NFAN=$NFAN NLAT=$NLAT RATE=$RATE REPS=$REPS WARMUP=$WARMUP BACKLOG=$BACKLOG SIZE=$SIZE"
  echo "redis: $(redis-server --version)"
  echo "shoal: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" \
       status --porcelain -- broker 2>/dev/null | grep -q . && echo ' (broker/ modified)')"
} | tee "$OUT/machine.txt"

row() { [[ $ROWS == *" $1 "* ]]; }

start_redis
start_broker broker.log

Q='bench-{run}'     # a fresh address per repetition ({run} is replaced by load.py)

# Closed loop: the producer keeps at most $BACKLOG messages sent but not yet received, so the
# rows measure steady-state capacity with meaningful latency.
row i && bench "i queue 1p1c at-least-once" "$N" -a "$Q" -n "$N" --max-backlog "$BACKLOG" \
  --warmup "$WARMUP"
row ii && bench "ii queue 1p1c presettled" "$N" -a "$Q" -n "$N" --max-backlog "$BACKLOG" \
  --presettled
row iii && bench "iii queue 1p4c competing" "$N" -a "$Q" -n "$N" --max-backlog "$BACKLOG" -k 4
row v && bench "v latency @${RATE}/s" "$NLAT" -a "$Q" -n "$NLAT" --rate "$RATE" \
  --max-backlog "$BACKLOG"

# Fan-out needs addresses auto-created as topics (see the header).
stop_broker
if row iv; then
  start_broker broker-topic.log SHOAL_DEFAULT_ADDRESS_KIND=topic
  bench "iv topic fan-out 1p4s" "$NFAN" -a "$Q" -n "$NFAN" --max-backlog "$BACKLOG" -k 4 --fanout
  stop_broker
fi

# Shared durable subscription, 4 consumers over 2 replicas (consumers 0 and 2 on the first).
if row s; then
  start_broker broker-shared-a.log
  FIRST_PID=$BROKER_PID
  env SHOAL_LOG_LEVEL=WARNING "$BROKER_PY" -m shoal_broker --listen "127.0.0.1:$PORT2" \
      --http "127.0.0.1:$HPORT2" --redis-url "redis://127.0.0.1:$RPORT/0" --replica-id bench2 \
      > "$OUT/broker-shared-b.log" 2>&1 &
  SECOND_PID=$!
  STARTED_PIDS+=("$SECOND_PID")
  for ((i = 0; i < 300; i++)); do
    curl -sf "http://127.0.0.1:$HPORT2/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
  echo "--- s shared durable subscription 4c over 2 replicas"
  r0=$(proc_cpu_s "$REDIS_PID")
  for ((rep = 1; rep <= REPS; rep++)); do
    timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/shared.py" --replica "127.0.0.1:$PORT" \
      --replica "127.0.0.1:$PORT2" --consumers 4 --count "$N" --max-backlog "$BACKLOG" \
      --size "$SIZE" --timeout "$RUN_TIMEOUT" --broker-pid "$FIRST_PID" --broker-pid "$SECOND_PID" \
      --label "shoal s shared durable subscription 4c/2 replicas rep $rep" 2>&1 \
      | tee -a "$OUT/log.txt" "$OUT/shared.txt" \
      || { echo "(shared: incomplete or failed)"; FAILED+=("shared"); }
  done
  r1=$(proc_cpu_s "$REDIS_PID")
  awk -v a="$r0" -v b="$r1" -v m="$((N * REPS))" 'BEGIN {
      printf "redis-server CPU | s shared durable subscription | %.1f s | %d msgs | %.1f us/msg\n",
      b - a, m, 1e6 * (b - a) / m }' | tee -a "$OUT/redis-cpu.txt"
  stop_broker
  BROKER_PID=$SECOND_PID stop_broker
fi

# Durable: Redis fsyncs every write before replying, the broker accepts only after that reply.
if row d; then
  kill -TERM "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true
  start_redis --appendonly yes --appendfsync always
  start_broker broker-fsync.log SHOAL_DURABILITY=fsync
  bench "i-durable queue 1p1c at-least-once" "$N" -a "bench-d-{run}" -n "$N" \
    --max-backlog "$BACKLOG" --durable
  stop_broker
fi

machine "after" | tee -a "$OUT/machine.txt"

echo
echo "## Shoal, medians of $REPS ($(nproc) cores)"
echo
touch "$J"  # (empty when only the shared row ran)
"$PY" "$HERE/load.py" table "$J" | tee "$OUT/table.md"
echo
[[ -f $OUT/shared.txt ]] && cat "$OUT/shared.txt"
cat "$OUT/redis-cpu.txt"
errs=$(grep -c -E 'ERROR|CRITICAL|Traceback' "$OUT"/broker*.log || true)
echo "broker log lines with ERROR/CRITICAL/Traceback: $(echo "$errs" | tr '\n' ' ')"
if ((${#FAILED[@]})); then
  echo "incomplete or failed steps: ${FAILED[*]}" >&2
  exit 1
fi
