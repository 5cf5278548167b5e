#!/usr/bin/env bash
# bench/instructions.sh - A/B the broker's instructions per message under valgrind's callgrind:
# a count, not a time, so it does not move with the machine's load or the VM's slow periods
# (bench/cpu.sh's µs per message moves up to 25 % between runs of the same tree).
# For each source tree (a checkout's broker/ directory, put first on PYTHONPATH): a private
# redis-server, the broker under callgrind, a warm-up run, counters zeroed, then the measured
# run of N messages; prints instructions per message for the whole broker process (user space:
# Python, proton, libc, ...) and the interpreter's own share. Callgrind slows the broker ~50x,
# so N stays small; periodic work (lease, policies, metric records) then weighs a little more
# per message than at full speed, alike for every tree. REPS runs per tree, interleaved.
#
# With MODES="standalone cluster" each tree is measured on both a standalone redis-server and a
# one-node Redis Cluster owning every slot (`redis+cluster://`), interleaved: the broker's own
# cost of cluster mode per message, free of the machine's noise (docs/performance.md#redis-cluster).
#
# usage: bench/instructions.sh SRC_A [SRC_B ...]     e.g. bench/instructions.sh /tmp/base/broker broker
# A tree may carry broker environment of its own after a colon, comma-separated, to A/B a setting
# on one tree: bench/instructions.sh broker broker:SHOAL_DUPLICATE_DETECTION=true
#
# Time-driven work (the loop-lag probe and the scheduled-message poll, each ~20 times a second;
# lease, trim and metric records every few seconds) costs the broker ~5 M instructions a second
# under callgrind whether messages flow or not, and a measured run lasts as long as the shared
# machine lets it: alone, that moved one tree's runs by up to 7 %. So each run first counts an
# idle window (IDLE seconds, after SETTLE seconds in which the warm-up's trim and span export
# end), and the measured run, counted until TAIL seconds after its last message (so that work it
# leaves behind, such as its spans' export, is its own), is corrected by that idle rate over its
# duration: "net" below. With IDLE=0 no window, no tail and no correction. The correction has
# its own error (the window holds one or two of the 5-10 s records): when the runs' lengths
# hardly vary (a quiet machine), the raw counts, printed too, are the tighter.
#
# Environment: N (2000), WARMUP (1000), REPS (2), ROW (bench/load.py options; default
# "--max-backlog 200": 1 -> 1 at-least-once), ENV (extra broker environment), MODES
# ("standalone"; "cluster" too or instead), IDLE (10), SETTLE (12), TAIL (8), PY, REPLICA (0;
# 1: the standalone Redis gets a replica, so that a tree run with SHOAL_DURABILITY=replicated
# has its WAITs confirmed).
# Loopback only; every process started is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${N:-2000}; WARMUP=${WARMUP:-1000}; REPS=${REPS:-2}; ROW=${ROW:---max-backlog 200}
ENV=${ENV:-}; read -r -a MODES <<< "${MODES:-standalone}"; IDLE=${IDLE:-10}; SETTLE=${SETTLE:-12}
TAIL=${TAIL:-8}; REPLICA=${REPLICA:-0}
(($# >= 1)) || { echo "usage: $0 SRC_A [SRC_B ...]" >&2; exit 2; }
command -v valgrind > /dev/null || { echo "valgrind is not installed" >&2; exit 2; }

WORK=$(mktemp -d /tmp/shoal-instr.XXXXXX)
stop_on_exit

load() {  # load PORT NAME COUNT
  # shellcheck disable=SC2086
  timeout -k 10 900 "$PY" "$HERE/load.py" run --port "$1" --timeout 600 -a "$2" \
      -n "$3" --size 1024 $ROW > "$WORK/load.out" 2>&1 \
      || { cat "$WORK/load.out" >&2; return 1; }
}

split_ir() {  # split_ir CALLGRIND_FILE: total instructions, then the interpreter's own
  "$PY" - "$1" <<'PY'
import collections, re, sys
names, cost, ob, skip = {}, collections.Counter(), None, False
for line in open(sys.argv[1]):
    named = re.match(r'c?ob=\((\d+)\) (.+)', line.strip())
    if named:
        names[named.group(1)] = named.group(2)
    if line.startswith('ob='):
        ob = re.match(r'ob=\((\d+)\)', line).group(1)
    elif line.startswith('calls='):
        skip = True  # the next cost line is the call's inclusive cost, not the caller's own
    elif line[:1].isdigit() or line[:1] in '+-*':
        parts = line.split()
        if not skip and len(parts) >= 2 and ob is not None:
            cost[names.get(ob, ob)] += int(parts[1])
        skip = False
total = sum(cost.values())
# the interpreter: libpython (a shared build such as pyenv's) or the executable itself (Debian's
# python3.11, like the official image's, has it linked in)
interpreter = re.compile(r'libpython|/python3[.0-9]*$')
print(total, sum(c for name, c in cost.items() if interpreter.search(name)))
PY
}

start_store() {  # start_store MODE PORT DIR BUS_PORT: sets REDIS_PID and URL
  local t
  if [[ $1 == cluster ]]; then
    start_redis "$2" "$3" --appendonly no --cluster-enabled yes \
        --cluster-config-file nodes.conf --cluster-port "$4"
    redis-cli -p "$2" CLUSTER ADDSLOTSRANGE 0 16383 > /dev/null
    for ((t = 0; t < 100; t++)); do
      redis-cli -p "$2" CLUSTER INFO | grep -q 'cluster_state:ok' && break; sleep 0.1; done
    URL="redis+cluster://127.0.0.1:$2"
  else
    start_redis "$2" "$3" --appendonly no
    URL="redis://127.0.0.1:$2/0"
    if ((REPLICA)); then  # a replica, for trees in `replicated` durability (WAIT 1 confirms)
      local primary=$REDIS_PID
      mkdir -p "$3/replica"
      start_redis "$5" "$3/replica" --appendonly no --replicaof 127.0.0.1 "$2"
      REPLICA_PID=$REDIS_PID; REDIS_PID=$primary
      for ((t = 0; t < 100; t++)); do
        redis-cli -p "$5" INFO replication | grep -q 'master_link_status:up' && break
        sleep 0.1
      done
    fi
  fi
}

echo "machine: nproc=$(nproc) N=$N WARMUP=$WARMUP REPS=$REPS ROW=$ROW ENV=$ENV MODES=${MODES[*]} REPLICA=$REPLICA"
for ((rep = 1; rep <= REPS; rep++)); do
  i=0
  for arg in "$@"; do
  for mode in "${MODES[@]}"; do
    src=${arg%%:*}; own=""
    [[ $arg == *:* ]] && own=${arg#*:} && own=${own//,/ }
    src=$(cd "$src" && pwd)
    build_wire "$src"
    dir=$WORK/$rep-$i
    mkdir -p "$dir"
    read -r rport aport hport bport sport < <(free_ports 5)
    REPLICA_PID=""
    start_store "$mode" "$rport" "$dir" "$bport" "$sport"
    # shellcheck disable=SC2086
    env PYTHONPATH="$src" SHOAL_LOG_LEVEL=WARNING $ENV $own valgrind --tool=callgrind \
        --callgrind-out-file="$dir/callgrind.%p" "$BROKER_PY" -m shoal_broker \
        --listen "127.0.0.1:$aport" --http "127.0.0.1:$hport" \
        --redis-url "$URL" --replica-id "instr$i" > "$dir/broker.log" 2>&1 &
    bpid=$!; STARTED_PIDS+=("$bpid")
    for ((t = 0; t < 1200; t++)); do
      curl -sf "http://127.0.0.1:$hport/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
    load "$aport" "warm-$rep-$i" "$WARMUP"
    idle_ir=0; idle_py=0; part=1
    if ((IDLE > 0)); then  # the idle window: dump part 1
      sleep "$SETTLE"
      callgrind_control -z "$bpid" > /dev/null 2>&1
      sleep "$IDLE"
      callgrind_control -d "$bpid" > /dev/null 2>&1
      read -r idle_ir idle_py < <(split_ir "$(ls "$dir"/callgrind.*.1)")
      part=2
    else
      callgrind_control -z "$bpid" > /dev/null 2>&1
    fi
    t0=$(date +%s.%N)
    load "$aport" "run-$rep-$i" "$N"
    ((IDLE > 0)) && sleep "$TAIL"  # work the run left behind (a span export) is the run's
    t1=$(date +%s.%N)
    callgrind_control -d "$bpid" > /dev/null 2>&1
    kill -TERM "$bpid"; wait "$bpid" || true
    kill -TERM "$REDIS_PID"; wait "$REDIS_PID" || true
    if [[ -n $REPLICA_PID ]]; then kill -TERM "$REPLICA_PID"; wait "$REPLICA_PID" || true; fi
    # the dump after zeroing holds the measured run; the one written at exit, only the stop
    read -r ir py_ir < <(split_ir "$(ls "$dir"/callgrind.*."$part")")
    read -r net net_py secs < <(awk -v ir="$ir" -v py="$py_ir" -v i="$idle_ir" -v ip="$idle_py" \
        -v w="$IDLE" -v a="$t0" -v b="$t1" -v n="$N" 'BEGIN { d = b - a; r = (w > 0) ? d / w : 0
        printf "%d %d %.1f\n", (ir - i * r) / n, (py - ip * r) / n, d }')
    echo "$i $((ir / N)) $((py_ir / N)) $src${own:+:${own// /,}} $mode $net $net_py $secs" \
        | tee -a "$WORK/results"
    i=$((i + 1))
  done
  done
done

echo
"$PY" - "$WORK/results" "$IDLE" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    tree, ir, py, src, mode, net, net_py, secs = line.split()
    runs[(int(tree), src, mode)].append((int(ir), int(py), int(net), int(net_py), float(secs)))
corrected = sys.argv[2] != '0'
first = {}
print('| tree | instructions per message | spread (min–max) | of which the interpreter | '
      'against tree 0 | raw | run seconds | source | Redis |')
print('|---|---|---|---|---|---|---|---|---|')
for (tree, src, mode), values in sorted(runs.items()):
    col = 2 if corrected else 0
    ir = statistics.median(v[col] for v in values)
    py = statistics.median(v[col + 1] for v in values)
    low, high = min(v[col] for v in values), max(v[col] for v in values)
    raw = statistics.median(v[0] for v in values)
    secs = statistics.median(v[4] for v in values)
    base = first.setdefault(mode, ir)
    print(f'| {tree} | {ir:,.0f} | {low:,}–{high:,} ({100 * (high - low) / ir:.1f} %) | '
          f'{py:,.0f} ({100 * py / ir:.0f} %) | {100 * (ir - base) / base:+.1f} % | {raw:,.0f} | '
          f'{secs:.0f} | {src} | {mode} |')
PY
