#!/usr/bin/env bash
# bench/scale.sh - replicas on one Redis: 1, 2, 4 ... Shoal brokers share one redis-server; each
# replica gets its own bench/load.py run (1 producer -> 1 consumer, at-least-once, closed loop, its own
# queue), all runs at once. Prints per replica count: aggregate msg/s, broker CPU µs per message
# (summed over replicas), Redis CPU µs per message, and where the machine's CPU went (brokers,
# Redis, load clients, everything else) in % of one core.
#
# usage: bench/scale.sh [OUTDIR]
#
# Environment: REPLICAS ("1 2 4"), N (messages per replica per run, 30000), REPS (3, median),
# BACKLOG (1000), PY, RUN_TIMEOUT (180). On a box with fewer cores than replicas + Redis
# + clients the aggregate cannot grow; the CPU split and the per-message costs are then the
# figures to size from (docs/capacity.md). Loopback only; everything started is stopped by PID.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
REPLICAS=${REPLICAS:-1 2 4}; N=${N:-30000}; REPS=${REPS:-3}; BACKLOG=${BACKLOG:-1000}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
OUT=${1:-/tmp/shoal-bench/scale-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/shoal-scale.XXXXXX)
stop_on_exit

machine_cpu_s() { awk -v hz="$(getconf CLK_TCK)" 'NR == 1 { print ($2 + $3 + $4 + $7 + $8) / hz }' /proc/stat; }

read -r RPORT < <(free_ports 1)
redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no --dir "$WORK" \
    --logfile "$OUT/redis.log" --daemonize no > /dev/null 2>&1 &
REDIS_PID=$!; STARTED_PIDS+=("$REDIS_PID")
for ((t = 0; t < 100; t++)); do redis-cli -p "$RPORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done

declare -a BPID APORT
start_replica() {  # index
  local i=$1 aport hport t
  read -r aport hport < <(free_ports 2)
  SHOAL_LOG_LEVEL=WARNING "$BROKER_PY" -m shoal_broker --listen "127.0.0.1:$aport" \
      --http "127.0.0.1:$hport" --redis-url "redis://127.0.0.1:$RPORT/0" --replica-id "scale$i" \
      > "$OUT/broker-$i.log" 2>&1 &
  BPID[i]=$!; APORT[i]=$aport; STARTED_PIDS+=("${BPID[i]}")
  for ((t = 0; t < 300; t++)); do curl -sf "http://127.0.0.1:$hport/readyz" > /dev/null 2>&1 && return 0; sleep 0.1; done
  echo "replica $i did not become ready" >&2; exit 1
}

echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg) N=$N per replica, REPS=$REPS" \
  | tee "$OUT/machine.txt"
RESULTS=$OUT/results.txt
: > "$RESULTS"
started=0
for r in $REPLICAS; do
  while ((started < r)); do start_replica "$started"; started=$((started + 1)); done
  for ((rep = 0; rep <= REPS; rep++)); do  # rep 0 warms up and is not counted
    n=$N; ((rep == 0)) && n=5000
    declare -a b0=()
    for ((i = 0; i < r; i++)); do b0[i]=$(proc_cpu_s "${BPID[i]}"); done
    r0=$(proc_cpu_s "$REDIS_PID"); m0=$(machine_cpu_s); t0=$(date +%s.%N)
    pids=()
    for ((i = 0; i < r; i++)); do
      rm -f "$WORK/run-$i.jsonl"
      timeout -k 10 $((RUN_TIMEOUT + 30)) "$PY" "$HERE/load.py" run \
        --port "${APORT[i]}" --timeout "$RUN_TIMEOUT" -a "scale-$r-$rep-$i" -n "$n" --size 1024 \
        --max-backlog "$BACKLOG" --json "$WORK/run-$i.jsonl" > "$WORK/run-$i.txt" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || { echo "a load run failed" >&2; cat "$WORK"/run-*.txt >&2; exit 1; }; done
    t1=$(date +%s.%N); m1=$(machine_cpu_s); r1=$(proc_cpu_s "$REDIS_PID")
    bsum=0
    for ((i = 0; i < r; i++)); do bsum=$(echo "$bsum + $(proc_cpu_s "${BPID[i]}") - ${b0[i]}" | bc); done
    ((rep == 0)) && continue
    rates=$(for ((i = 0; i < r; i++)); do load_field "$WORK/run-$i.jsonl" msgs_per_s; done \
            | paste -sd+ | bc)
    # the load clients' CPU, as bench/load.py reports it (% of one core over its run)
    clients=$(for ((i = 0; i < r; i++)); do load_field "$WORK/run-$i.jsonl" client_cpu_pct; done \
              | paste -sd+ | bc)
    awk -v r="$r" -v n="$((n * r))" -v wall="$(echo "$t1 - $t0" | bc)" -v b="$bsum" \
        -v red="$(echo "$r1 - $r0" | bc)" -v m="$(echo "$m1 - $m0" | bc)" \
        -v clients="${clients:-0}" -v rates="$rates" 'BEGIN {
      c = clients / 100 * wall
      printf "%d %.0f %.1f %.1f %.0f %.0f %.0f %.0f\n", r, rates, 1e6 * b / n, 1e6 * red / n,
        100 * b / wall, 100 * red / wall, 100 * c / wall, 100 * (m - b - red - c) / wall }' \
      | tee -a "$RESULTS"
  done
done

echo
echo "| replicas | msg/s, all replicas | broker µs/msg (all replicas) | Redis µs/msg | brokers CPU % | Redis CPU % | clients CPU % | other CPU % |"
echo "|---|---|---|---|---|---|---|---|"
"$PY" -c '
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
for r in dict.fromkeys(row[0] for row in rows):
    mine = [row for row in rows if row[0] == r]
    med = [statistics.median(float(row[c]) for row in mine) for c in range(1, 8)]
    print(f"| {r} | {med[0]:,.0f} | {med[1]:.1f} | {med[2]:.1f} | " + " | ".join(f"{v:.0f}" for v in med[3:]) + " |")
' "$RESULTS" | tee "$OUT/table.md"
echo "machine after: loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"
