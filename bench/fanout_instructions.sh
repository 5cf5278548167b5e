#!/usr/bin/env bash
# bench/fanout_instructions.sh - A/B the broker's instructions over a small fan-out under
# valgrind's callgrind: a count, not a time, where row b's rates move with the machine.
# For each source tree (a checkout's broker/ directory, first on PYTHONPATH): a private
# redis-server and the broker under callgrind; bench/matrix.py fanout once with plain
# subscriptions (the warm-up), counters zeroed, then once with shared durable ones (the count).
# Prints each tree's instructions over the counted run and its deliveries. REPS runs per tree,
# interleaved (docs/performance.md#entries-read-in-c).
#
# usage: bench/fanout_instructions.sh SRC_A [SRC_B ...]   e.g. /tmp/base/broker broker
# Environment: SUBS (100), HELD (20), NB (400), REPS (2), PY.
# Loopback only; every process started is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
SUBS=${SUBS:-100}; HELD=${HELD:-20}; NB=${NB:-400}; REPS=${REPS:-2}
(($# >= 1)) || { echo "usage: $0 SRC_A [SRC_B ...]" >&2; exit 2; }
command -v valgrind > /dev/null || { echo "valgrind is not installed" >&2; exit 2; }

WORK=$(mktemp -d /tmp/shoal-fanout-instr.XXXXXX)
stop_on_exit

fanout() {  # fanout PORT ADDRESS OUT [--shared]
  timeout -k 10 1500 "$PY" "$HERE/matrix.py" fanout --port "$1" -a "$2" --subs "$SUBS" \
      --held "$HELD" -n "$NB" --timeout 1200 "${@:4}" > "$3" 2>&1 || { cat "$3" >&2; return 1; }
}

echo "machine: nproc=$(nproc) SUBS=$SUBS HELD=$HELD NB=$NB REPS=$REPS"
for ((rep = 1; rep <= REPS; rep++)); do
  i=0
  for arg in "$@"; do
    src=$(cd "$arg" && pwd)
    build_wire "$src"
    dir=$WORK/$rep-$i
    mkdir -p "$dir"
    read -r rport aport hport < <(free_ports 3)
    start_redis "$rport" "$dir" --appendonly no
    env PYTHONPATH="$src" SHOAL_LOG_LEVEL=WARNING SHOAL_DEFAULT_ADDRESS_KIND=topic \
        valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.%p" "$BROKER_PY" \
        -m shoal_broker --listen "127.0.0.1:$aport" --http "127.0.0.1:$hport" \
        --redis-url "redis://127.0.0.1:$rport/0" --replica-id "fanout$i" > "$dir/broker.log" 2>&1 &
    bpid=$!; STARTED_PIDS+=("$bpid")
    for ((t = 0; t < 1200; t++)); do
      curl -sf "http://127.0.0.1:$hport/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
    run=$RANDOM$RANDOM
    fanout "$aport" "fi-$run" "$dir/plain.out"
    callgrind_control -z "$bpid" > /dev/null 2>&1
    fanout "$aport" "fi-s-$run" "$dir/shared.out" --shared
    callgrind_control -d "$bpid" > /dev/null 2>&1
    sleep 2
    total=$(grep -hE '^(summary|totals):' "$dir"/callgrind.*.1 | head -1 | awk '{print $2}')
    delivered=$(grep -o '"delivered": [0-9]*' "$dir/shared.out" | awk '{print $2}')
    echo "$rep $i $src instructions=$total delivered=$delivered"
    kill "$bpid" 2> /dev/null || true
    wait "$bpid" 2> /dev/null || true
    kill "$REDIS_PID" 2> /dev/null || true
    i=$((i + 1))
  done
done
