#!/usr/bin/env bash
# bench/loop_probe.sh - row a's latency run (QUEUES queues, one producer and one consumer link
# each, RATE msg/s in all, N messages) against a broker under bench/loop_probe.py: the loop's lag
# percentiles and, with PROBE_ASYNCIO=1, the callbacks above 1 ms; PROBE_PROFILE=1 adds a
# cProfile of the latency run (OUT/profile.pstats). As in row a, a closed-loop run over other
# QUEUES queues (NA messages, 0: none) comes first, so the latency run has 2 x QUEUES addresses.
#
# The probe's window is WINDOW (20) seconds from WINDOW_FROM (6) seconds into the latency run;
# Redis's slow log over it (commands slower than SLOWLOG_US, 1000 µs) goes to OUT/slowlog.txt.
#
# usage: bench/loop_probe.sh [OUT]    environment: QUEUES (1000), RATE (1000), N (30000), NA (20000)
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
OUT=${1:-/tmp/shoal-bench/loop-probe-$(date +%Y%m%d-%H%M%S)}
QUEUES=${QUEUES:-1000}; RATE=${RATE:-1000}; N=${N:-30000}; NA=${NA:-20000}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER=1000000 SHOAL_MAX_LINKS_PER_SESSION=100000
start_stack_probe() {
  WORK=$(mktemp -d /tmp/shoal-loop-probe.XXXXXX)
  stop_on_exit
  read -r RPORT APORT HPORT < <(free_ports 3)
  start_redis "$RPORT" "$WORK" --appendonly no
  local t profile=""
  [[ ${PROBE_PROFILE:-0} == 1 ]] && profile=$OUT/profile.pstats
  PROBE_PROFILE=$profile SHOAL_LOG_LEVEL=WARNING "$BROKER_PY" "$HERE/loop_probe.py" "$OUT/probe.json" \
      --listen "127.0.0.1:$APORT" --http "127.0.0.1:$HPORT" \
      --redis-url "redis://127.0.0.1:$RPORT/0" --replica-id probe > "$OUT/broker.log" 2>&1 &
  BROKER_PID=$!; STARTED_PIDS+=("$BROKER_PID")
  for ((t = 0; t < 300; t++)); do
    curl -sf "http://127.0.0.1:$HPORT/readyz" > /dev/null 2>&1 && return 0; sleep 0.1; done
  echo "broker did not become ready" >&2; return 1
}
start_stack_probe
echo "loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/machine.txt"
if ((NA > 0)); then
  timeout -k 10 400 "$PY" "$HERE/load.py" run --port "$APORT" --timeout 300 -a 'lpa-{run}' \
      --addresses "$QUEUES" -n "$NA" --max-backlog "$((10 * QUEUES))" --broker-pid "$BROKER_PID" \
      --label saturation --json "$OUT/load.jsonl" | tail -1
fi
timeout -k 10 400 "$PY" "$HERE/load.py" run --port "$APORT" --timeout 300 -a 'lpb-{run}' \
    --addresses "$QUEUES" -n "$N" --rate "$RATE" --max-backlog 1000 --broker-pid "$BROKER_PID" \
    --label "@$RATE/s" --json "$OUT/load.jsonl" | tail -1 &
LOAD_PID=$!
# the window: from WINDOW_FROM seconds into the latency run (the links attached) for WINDOW s
sleep "${WINDOW_FROM:-6}"; kill -USR1 "$BROKER_PID"
redis-cli -p "$RPORT" config set slowlog-log-slower-than "${SLOWLOG_US:-1000}" > /dev/null
redis-cli -p "$RPORT" slowlog reset > /dev/null
sleep "${WINDOW:-20}"; kill -USR2 "$BROKER_PID"
# Redis commands slower than SLOWLOG_US (1000) µs within the window: count, and the slowest
redis-cli -p "$RPORT" slowlog get 1000 > "$OUT/slowlog.txt"
echo "redis slowlog: $(redis-cli -p "$RPORT" slowlog len) commands over ${SLOWLOG_US:-1000} µs" \
  | tee -a "$OUT/machine.txt"
wait "$LOAD_PID"
sleep 1
echo "loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"
cat "$OUT/probe.json"
