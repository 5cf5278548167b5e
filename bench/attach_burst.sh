#!/usr/bin/env bash
# bench/attach_burst.sh - an attach burst per source tree: LINKS consumers on fresh queues opened
# at once on one connection (bench/attach_burst.py), timed to the last attach answered and to
# the last queue listing the broker as a watcher, with the broker's CPU over the burst and
# Redis's SSUBSCRIBE and HSET calls. Each tree (a checkout's broker/ directory, put first on
# PYTHONPATH; `git archive REV broker | tar -x -C /tmp/old` makes one) gets its own redis-server
# and broker; the trees take turns, REPS rounds, each round on fresh queues. Prints every run,
# then the medians per tree.
#
# usage: bench/attach_burst.sh SRC_A [SRC_B ...]    environment: LINKS (1000), REPS (3)
# Loopback only; every process started is stopped by PID on exit.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
LINKS=${LINKS:-1000}; REPS=${REPS:-3}
(($# >= 1)) || { echo "usage: $0 SRC_A [SRC_B ...]" >&2; exit 2; }
export SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER=1000000 SHOAL_MAX_LINKS_PER_SESSION=100000
WORK=$(mktemp -d /tmp/shoal-attach-burst.XXXXXX)
stop_on_exit

declare -a SRC BPID AMQP_PORTS REDIS_PORTS
i=0
for arg in "$@"; do
  start_tree "$i" "$arg" "burst$i"
  SRC[i]=$(cd "$arg" && pwd); BPID[i]=$BROKER_PID; AMQP_PORTS[i]=$APORT; REDIS_PORTS[i]=$RPORT
  echo "tree $i: ${SRC[i]} (broker pid $BROKER_PID)"
  i=$((i + 1))
done
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg) LINKS=$LINKS REPS=$REPS"

for ((rep = 1; rep <= REPS; rep++)); do
  for ((j = 0; j < ${#SRC[@]}; j++)); do
    out=$(timeout -k 10 200 "$PY" "$HERE/attach_burst.py" --port "${AMQP_PORTS[j]}" \
          --redis-port "${REDIS_PORTS[j]}" --broker-pid "${BPID[j]}" --replica "burst$j" \
          --links "$LINKS" --run "burst-$rep")
    echo "tree $j round $rep: $out"
    echo "$j $out" >> "$WORK/runs.txt"
  done
done
"$PY" - "$WORK/runs.txt" "${SRC[@]}" <<'EOF'
import json, statistics, sys
runs: dict[int, list[dict]] = {}
for line in open(sys.argv[1]):
    tree, _, row = line.partition(' ')
    runs.setdefault(int(tree), []).append(json.loads(row))
for tree, rows in sorted(runs.items()):
    medians = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != 'links'}
    print(f'tree {tree} ({sys.argv[2 + tree]}), medians of {len(rows)}: {json.dumps(medians)}')
EOF
