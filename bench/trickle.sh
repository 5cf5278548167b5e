#!/usr/bin/env bash
# bench/trickle.sh - what one message costs when nothing batches: a 1 -> 1 at-least-once load
# at a fixed rate (the latency row), with the broker's CPU split into user and system time, its
# socket reads, writes and sleeps per message (/proc/PID/io, /proc/PID/status), Redis CPU and
# the Redis commands per message (INFO commandstats), the load generator's p50/p99, and the
# machine's steal meanwhile (the p99 follows it: docs/performance.md#steal).
#
# usage: bench/trickle.sh      Environment: RATE (1000 msg/s), N (5000 per rep), REPS (3),
#                              WARMUP (3000), PY, RUN_TIMEOUT (120)
# Starts its own redis-server and broker on free loopback ports; stops them by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
RATE=${RATE:-1000}; N=${N:-5000}; REPS=${REPS:-3}; WARMUP=${WARMUP:-3000}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
start_stack trickle
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg); $N messages at $RATE/s, $REPS reps"

counters() {  # utime stime (clock ticks) reads writes voluntary-switches of the broker
  awk '{ sub(/.*\) /, ""); printf "%s %s ", $12, $13 }' "/proc/$BROKER_PID/stat"
  awk '/^syscr/ { r = $2 } /^syscw/ { w = $2 } END { printf "%s %s ", r, w }' "/proc/$BROKER_PID/io"
  awk '/^voluntary_ctxt_switches/ { print $2 }' "/proc/$BROKER_PID/status"
}

load() {
  timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/load.py" run --port "$APORT" \
      --timeout "$RUN_TIMEOUT" --size 1024 "$@"
}

load -a warmup -n "$WARMUP" --max-backlog 1000 > /dev/null
echo
echo "| rep | p50 ms | p99 ms | broker µs/msg (user + sys) | reads/msg | writes/msg | sleeps/msg | Redis µs/msg | Redis calls/msg | steal % |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for ((rep = 1; rep <= REPS; rep++)); do
  redis-cli -p "$RPORT" config resetstat > /dev/null
  read -r u0 s0 r0 w0 v0 < <(counters)
  c0=$(proc_cpu_s "$REDIS_PID")
  m0=$(cpu_ticks)
  load -a "trickle-$rep" -n "$N" --rate "$RATE" --json "$WORK/load.jsonl" > /dev/null 2>&1
  read -r _ steal < <(machine_share "$m0" "$(cpu_ticks)")
  read -r u1 s1 r1 w1 v1 < <(counters)
  c1=$(proc_cpu_s "$REDIS_PID")
  lat="p50=$(load_field "$WORK/load.jsonl" p50_ms) p99=$(load_field "$WORK/load.jsonl" p99_ms)"
  calls=$(redis-cli -p "$RPORT" info commandstats \
          | awk -F'[:=,]' '/^cmdstat_/ { s += $3 } END { print s + 0 }')
  awk -v rep="$rep" -v n="$N" -v hz="$(getconf CLK_TCK)" -v lat="$lat" \
      -v u="$((u1 - u0))" -v s="$((s1 - s0))" -v r="$((r1 - r0))" -v w="$((w1 - w0))" \
      -v v="$((v1 - v0))" -v c="$(echo "$c1 - $c0" | bc)" -v calls="$calls" -v steal="$steal" 'BEGIN {
        split(lat, l, /[= ]/)
        printf "| %d | %s | %s | %.0f (%.0f + %.0f) | %.2f | %.2f | %.2f | %.0f | %.2f | %s |\n",
          rep, l[2], l[4], 1e6 * (u + s) / hz / n, 1e6 * u / hz / n, 1e6 * s / hz / n,
          r / n, w / n, v / n, 1e6 * c / n, calls / n, steal }'
done
echo
echo "Redis commands in the last rep (calls, µs per call):"
redis-cli -p "$RPORT" info commandstats | awk -F'[:=,]' '/^cmdstat_/ {
  sub(/^cmdstat_/, "", $1); printf "  %-16s %8d %8s\n", $1, $3, $7 }' | sort -k2 -n -r | head -12
