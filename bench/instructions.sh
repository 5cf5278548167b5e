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
# A tree may carry broker environment of its own after a '+', comma-separated, so that settings
# are A/B'd in one run: broker+SHOAL_TRACING=true,SHOAL_TRACING_SAMPLE_RATIO=0.01
#
# Environment: N (2000), WARMUP (1000), REPS (2), ROW (bench/load.py options; default
# "--max-backlog 200": 1 -> 1 at-least-once), ENV (extra broker environment), MODES
# ("standalone"; "cluster" too or instead), PY.
# Loopback only; every process started is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${N:-2000}; WARMUP=${WARMUP:-1000}; REPS=${REPS:-2}; ROW=${ROW:---max-backlog 200}
ENV=${ENV:-}; read -r -a MODES <<< "${MODES:-standalone}"
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
  fi
}

echo "machine: nproc=$(nproc) N=$N WARMUP=$WARMUP REPS=$REPS ROW=$ROW ENV=$ENV MODES=${MODES[*]}"
for ((rep = 1; rep <= REPS; rep++)); do
  i=0
  for tree in "$@"; do
  for mode in "${MODES[@]}"; do
    src=${tree%%+*}; own_env=""
    [[ $tree == *+* ]] && own_env=${tree#*+} && own_env=${own_env//,/ }
    src=$(cd "$src" && pwd)
    build_wire "$src"
    dir=$WORK/$rep-$i
    mkdir -p "$dir"
    read -r rport aport hport bport < <(free_ports 4)
    start_store "$mode" "$rport" "$dir" "$bport"
    # shellcheck disable=SC2086
    env PYTHONPATH="$src" SHOAL_LOG_LEVEL=WARNING $ENV $own_env valgrind --tool=callgrind \
        --callgrind-out-file="$dir/callgrind.%p" "$BROKER_PY" -m shoal_broker \
        --listen "127.0.0.1:$aport" --http "127.0.0.1:$hport" \
        --redis-url "$URL" --replica-id "instr$i" > "$dir/broker.log" 2>&1 &
    bpid=$!; STARTED_PIDS+=("$bpid")
    for ((t = 0; t < 1200; t++)); do
      curl -sf "http://127.0.0.1:$hport/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
    load "$aport" "warm-$rep-$i" "$WARMUP"
    callgrind_control -z "$bpid" > /dev/null 2>&1
    load "$aport" "run-$rep-$i" "$N"
    callgrind_control -d "$bpid" > /dev/null 2>&1
    kill -TERM "$bpid"; wait "$bpid" || true
    kill -TERM "$REDIS_PID"; wait "$REDIS_PID" || true
    # the dump after zeroing holds the measured run; the one written at exit, only the stop
    read -r ir py_ir < <(split_ir "$(ls "$dir"/callgrind.*.1)")
    label=$src${own_env:++${own_env// /,}}
    echo "$i $((ir / N)) $((py_ir / N)) $label $mode" | tee -a "$WORK/results"
    i=$((i + 1))
  done
  done
done

echo
"$PY" - "$WORK/results" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    tree, ir, py, src, mode = line.split()
    runs[(int(tree), src, mode)].append((int(ir), int(py)))
print('| tree | instructions per message | of which the interpreter | source | Redis |')
print('|---|---|---|---|---|')
for (tree, src, mode), values in sorted(runs.items()):
    ir = statistics.median(v[0] for v in values)
    py = statistics.median(v[1] for v in values)
    print(f'| {tree} | {ir:,.0f} | {py:,.0f} ({100 * py / ir:.0f} %) | {src} | {mode} |')
PY
