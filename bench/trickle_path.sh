#!/usr/bin/env bash
# bench/trickle_path.sh - A/B source trees on the latency row's tail: which messages at RATE msg/s
# did not go ahead to their consumer (docs/performance.md#send-ahead) but through a publish and a
# fetch, and what that costs them. Per tree (a checkout's broker/ directory, first on PYTHONPATH)
# one private redis-server and broker; ROUNDS rounds, one run of each tree in turn.
#
# Each run reports the load's p50 and p99, the broker's CPU per message, and the fetch scripts
# Redis ran per message (EVALSHA of fetch.lua: a message not sent ahead is fetched). With TRACE=1
# the run is watched by `perf trace` (reads and writes, TRACE_SECONDS from a second in) instead,
# and each message's time in the broker, from reading its transfer to writing it to the consumer,
# is split by whether a Redis reply was read in between (not sent ahead); the trace adds a few µs
# to each system call and makes more messages miss going ahead, alike for every tree.
#
# usage: bench/trickle_path.sh SRC_A [SRC_B ...]   e.g. bench/trickle_path.sh /tmp/base/broker broker
# Environment: ROUNDS (5), N (5000), RATE (1000), TRACE (0), TRACE_SECONDS (2), PY.
# Loopback only; every process started is stopped by PID on exit.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}; N=${N:-5000}; RATE=${RATE:-1000}; TRACE=${TRACE:-0}
TRACE_SECONDS=${TRACE_SECONDS:-2}
(($# >= 1)) || { echo "usage: $0 SRC_A [SRC_B ...]" >&2; exit 2; }
WORK=$(mktemp -d /tmp/shoal-trickle-path.XXXXXX)
stop_on_exit

declare -a AMQP_PORTS BPID REDIS_PORTS
i=0
for arg in "$@"; do
  start_tree "$i" "$arg" "path$i"
  src=$(cd "$arg" && pwd)
  BPID[i]=$BROKER_PID; AMQP_PORTS[i]=$APORT; REDIS_PORTS[i]=$RPORT
  timeout -k 10 200 "$PY" "$HERE/load.py" run --port "$APORT" -a warmup -n 3000 \
      --max-backlog 1000 > /dev/null
  echo "tree $i: $src (broker pid ${BPID[i]})"
  i=$((i + 1))
done
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg) N=$N RATE=$RATE TRACE=$TRACE"

split() {  # split TRACE_FILE: the broker's transfer-in to transfer-out times, ahead or not
  "$PY" - "$1" <<'PY'
import re, sys
recs = []
for line in open(sys.argv[1]):
    m = re.match(r'\s*([\d.]+) \(.*?\): \S+ (read|write)\(fd: (\d+).*= (\d+)$', line.strip())
    if m:
        recs.append((float(m[1]), m[2], m[3], int(m[4])))
def busiest(op):  # the fd most often read (write) with a whole 1 KiB message: producer (consumer)
    fds = [r[2] for r in recs if r[1] == op and r[3] == 1071]
    return max(set(fds), key=fds.count) if fds else None
prod, cons = busiest('read'), busiest('write')
ahead, via, t0, other = [], [], None, False
for t, op, fd, n in recs:
    if op == 'read' and fd == prod and n == 1071:
        t0, other = t, False
    elif t0 is not None and op == 'read' and fd not in (prod, cons):
        other = True  # a Redis reply came first: the message was fetched
    elif t0 is not None and op == 'write' and fd == cons and n == 1071:
        (via if other else ahead).append(1000 * (t - t0))
        t0 = None
def q(d, p):
    return d[min(len(d) - 1, int(len(d) * p))] if d else float('nan')
ahead.sort(); via.sort(); both = sorted(ahead + via)
print(f'in the broker p50/p90/p99 {q(both, .5):.0f}/{q(both, .9):.0f}/{q(both, .99):.0f} µs, '
      f'not ahead {len(via)}/{len(both)} ({100 * len(via) / max(1, len(both)):.1f} %, '
      f'p50 {q(via, .5):.0f} µs)')
PY
}

for ((r = 1; r <= ROUNDS; r++)); do
  for ((j = 0; j < i; j++)); do
    redis-cli -p "${REDIS_PORTS[j]}" config resetstat > /dev/null
    c0=$(proc_cpu_s "${BPID[j]}")
    timeout -k 10 200 "$PY" "$HERE/load.py" run --port "${AMQP_PORTS[j]}" -a "r$r" -n "$N" \
        --rate "$RATE" --json "$WORK/load$j.jsonl" > /dev/null &
    LOAD_PID=$!
    if [[ $TRACE == 1 ]]; then
      sleep 1
      timeout "$TRACE_SECONDS" perf trace -e read,write -p "${BPID[j]}" -o "$WORK/trace.txt" \
          2> /dev/null || true
    fi
    wait "$LOAD_PID"
    c1=$(proc_cpu_s "${BPID[j]}")
    fetches=$(redis-cli -p "${REDIS_PORTS[j]}" info commandstats \
              | awk -F'[:=,]' '/^cmdstat_evalsha:/ { print $3 }')
    line="round $r tree $j: p50 $(load_field "$WORK/load$j.jsonl" p50_ms) ms"
    line+=" p99 $(load_field "$WORK/load$j.jsonl" p99_ms) ms"
    line+=", broker $(echo "($c1 - $c0) * 1000000 / $N" | bc) µs/msg"
    line+=", fetch scripts $(echo "scale=3; ${fetches:-0} / $N" | bc)/msg"
    line+=", load $(cut -d' ' -f1 /proc/loadavg)"
    if [[ $TRACE == 1 ]]; then line+="; $(split "$WORK/trace.txt")"; fi
    echo "$line"
  done
done
