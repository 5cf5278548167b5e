#!/usr/bin/env bash
# bench/trickle_count.sh - what one message at a trickle makes the broker do, counted rather than
# timed: its system calls (by name) and context switches, its event-loop scheduling (call_soon,
# call_later, call_at, create_task, timers cancelled: by what made them), Redis round trips and
# commands, and the AMQP frames written to and read from each client, all per message, over one
# 1 -> 1 at-least-once run at RATE msg/s (the latency row). The counts are what a message costs in
# kinds of work; bench/trickle.sh gives its CPU time and latency (the probes here cost CPU).
#
# How: the broker runs under bench/loop_probe.py (PROBE_COUNT=1, PROBE_LAG=0: its loop's
# scheduling methods count their callers between SIGUSR1 and SIGUSR2); `perf stat` counts the
# broker's system-call and sched_switch tracepoints (in the kernel: no ptrace slowing the
# broker); Redis's INFO stats and commandstats are reset before the run. The frames come from a
# second run of NF messages against a second broker with PN_TRACE_FRM=1 (proton logs every
# frame, a write each, which would count among the first run's system calls).
#
# usage: bench/trickle_count.sh [OUT]   Environment: RATE (1000 msg/s), N (5000), NF (1000),
#                                       WARMUP (3000), PY
# Starts its own redis-server and broker on free loopback ports; stops them by PID on exit.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
OUT=${1:-/tmp/shoal-bench/trickle-count-$(date +%Y%m%d-%H%M%S)}
RATE=${RATE:-1000}; N=${N:-5000}; NF=${NF:-1000}; WARMUP=${WARMUP:-3000}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
command -v perf > /dev/null || { echo "perf is needed (linux-perf)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/shoal-trickle-count.XXXXXX)
stop_on_exit
read -r RPORT APORT HPORT FPORT FHPORT < <(free_ports 5)
start_redis "$RPORT" "$WORK" --appendonly no
PROBE_COUNT=1 PROBE_LAG=0 SHOAL_LOG_LEVEL=WARNING "$BROKER_PY" "$HERE/loop_probe.py" \
    "$OUT/probe.json" --listen "127.0.0.1:$APORT" --http "127.0.0.1:$HPORT" \
    --redis-url "redis://127.0.0.1:$RPORT/0" --replica-id count > "$WORK/broker.log" 2>&1 &
BROKER_PID=$!; STARTED_PIDS+=("$BROKER_PID")
for ((t = 0; t < 300; t++)); do
  curl -sf "http://127.0.0.1:$HPORT/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$HPORT/readyz" > /dev/null || { echo "broker not ready" >&2; exit 1; }

load() {
  timeout -k 10 200 "$PY" "$HERE/load.py" run --timeout 120 --size 1024 "$@"
}
load --port "$APORT" -a warmup -n "$WARMUP" --max-backlog 1000 > /dev/null
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg); $N messages at $RATE/s" \
  | tee "$OUT/machine.txt"

EVENTS=raw_syscalls:sys_enter,sched:sched_switch
for s in read write writev sendto recvfrom epoll_pwait epoll_wait getpid futex epoll_ctl; do
  EVENTS+=,syscalls:sys_enter_$s
done
redis-cli -p "$RPORT" config resetstat > /dev/null
perf stat -x, -e "$EVENTS" -p "$BROKER_PID" -o "$OUT/perf-stat.csv" &
PERF_PID=$!; STARTED_PIDS+=("$PERF_PID")
sleep 0.5
kill -USR1 "$BROKER_PID"
load --port "$APORT" -a trickle -n "$N" --rate "$RATE" --json "$OUT/load.jsonl" | tail -1
kill -USR2 "$BROKER_PID"
sleep 0.5
kill -INT "$PERF_PID"; wait "$PERF_PID" || true
redis-cli -p "$RPORT" info stats > "$OUT/redis-stats.txt"
redis-cli -p "$RPORT" info commandstats > "$OUT/redis-commandstats.txt"
stop_started; STARTED_PIDS=()
start_redis "$RPORT" "$WORK" --appendonly no
PN_TRACE_FRM=1 start_broker "$FPORT" "$FHPORT" "$RPORT" frames "$WORK/frames-broker.log"
load --port "$FPORT" -a warmup -n 500 --max-backlog 1000 > /dev/null
mark=$(wc -l < "$WORK/frames-broker.log")
load --port "$FPORT" -a frames -n "$NF" --rate "$RATE" | tail -1
sleep 0.5
tail -n +"$((mark + 1))" "$WORK/frames-broker.log" > "$OUT/frames.log"

"$PY" - "$OUT" "$N" "$NF" <<'PY'
import collections, json, re, sys
out, n, nf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(f'\nper message ({n} messages; the perf window is the run and ~1 s around it)\n')
print('| what | per message |\n|---|---|')
for line in open(f'{out}/perf-stat.csv'):
    parts = line.strip().split(',')
    if len(parts) > 2 and parts[0].replace('.', '').isdigit():
        print(f'| {parts[2]} | {int(float(parts[0])) / n:.2f} |')
stats = dict(l.strip().split(':', 1) for l in open(f'{out}/redis-stats.txt') if ':' in l)
print(f'| Redis reads (requests the broker wrote) | {int(stats["total_reads_processed"]) / n:.2f} |')
print(f'| Redis commands (scripts\' included) | {int(stats["total_commands_processed"]) / n:.2f} |')
calls = {}
for l in open(f'{out}/redis-commandstats.txt'):
    m = re.match(r'cmdstat_(\S+):calls=(\d+),usec=(\d+)', l)
    if m and m.group(1) != 'config|resetstat':
        calls[m.group(1)] = (int(m.group(2)), int(m.group(3)))
for name, (c, us) in sorted(calls.items(), key=lambda kv: -kv[1][0])[:8]:
    print(f'| Redis {name} | {c / n:.2f} ({us / max(c, 1):.1f} µs each) |')
role, frames = {}, collections.Counter()
for l in open(f'{out}/frames.log'):
    m = re.match(r'\[(0x[0-9a-f]+)\]:\s*AMQP:FRAME:\d*\s*(<-|->)\s*@(\w+)', l)
    if not m:
        continue
    conn, way, kind = m.groups()
    if kind == 'open' and way == '<-':
        c = re.search(r'container-id="shoal-bench-(producer|consumer)', l)
        role[conn] = c.group(1) if c else 'other'
    frames[(role.get(conn, 'other'), way, kind)] += 1
for (who, way, kind), c in sorted(frames.items()):
    if c >= nf / 100:
        print(f'| frames {"to" if way == "->" else "from"} the {who}: {kind} | {c / nf:.3f} |')
probe = json.load(open(f'{out}/probe.json'))
print(f'| broker CPU under the probes, µs | {1e6 * probe["cpu_s"] / n:.0f} |')
for what, c in probe.get('loop_calls', {}).items():
    if c >= n / 100 and 'loop_probe.py' not in what:  # call_at made through call_later: once
        print(f'| loop {what} | {c / n:.2f} |')
PY
