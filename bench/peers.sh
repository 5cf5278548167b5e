#!/usr/bin/env bash
# bench/peers.sh - Shoal and RabbitMQ interleaved on one machine over the same minutes: ROUNDS
# rounds of bench/run.sh then bench/rabbitmq.sh (A B A B ...), one repetition per row per
# round, both driven by bench/load.py with the same rows and options. Prints the medians over
# rounds and the Shoal/RabbitMQ ratio per row (bench/compare.py).
#
# usage: bench/peers.sh [OUTDIR]      (or: make bench-peers; QUICK=1 for a short check)
#
# Environment: ROUNDS (3); N, NFAN, NLAT, RATE, BACKLOG, SIZE, WARMUP are passed to both
# (defaults in run.sh; QUICK=1 makes them small); ROWS selects rows (see run.sh; RabbitMQ
# skips "s", which it has no counterpart for); PY (python with python-qpid-proton, default
# .venv/bin/python).
#
# RabbitMQ is Debian's rabbitmq-server package (3.10, with the rabbitmq_amqp1_0 plugin),
# installed by bench/rabbitmq.sh when missing and run as a private node on free loopback ports.
# Its "i-durable" row (durable queue, persistent messages) pairs with Shoal's
# (SHOAL_DURABILITY=fsync, Redis appendfsync always).
#
# Each round's share of the machine (busy and steal %, from /proc/stat) goes to machine.json
# beside its results, and compare.py prints it per round: a VM's steal moves the p99 row.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
OUT=${1:-/tmp/shoal-bench/peers-$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-3}
export PY=${PY:-$ROOT/.venv/bin/python}
export REPS=1
mkdir -p "$OUT"

measured() {  # measured DIR COMMAND...: run it, then record the machine's share meanwhile
  local dir=$1 before busy steal status=0
  shift
  before=$(cpu_ticks)
  "$@" || status=$?
  read -r busy steal < <(machine_share "$before" "$(cpu_ticks)")
  mkdir -p "$dir"
  echo "{\"busy_pct\": $busy, \"steal_pct\": $steal}" > "$dir/machine.json"
  echo "=== machine meanwhile: busy $busy %, steal $steal %"
  return "$status"
}

rc=0
for ((round = 1; round <= ROUNDS; round++)); do
  echo "=== round $round of $ROUNDS: Shoal ($(cut -d' ' -f1-3 /proc/loadavg))"
  measured "$OUT/shoal-$round" bash "$HERE/run.sh" "$OUT/shoal-$round" || rc=$?
  echo "=== round $round of $ROUNDS: RabbitMQ ($(cut -d' ' -f1-3 /proc/loadavg))"
  # rabbitmq.sh bounds every run itself and stops RabbitMQ (and its epmd) by PID
  measured "$OUT/rabbitmq-$round" timeout -k 30 3600 bash "$HERE/rabbitmq.sh" "$OUT/rabbitmq-$round" \
    || rc=$?
done

echo
echo "## Shoal beside RabbitMQ: medians of $ROUNDS interleaved rounds ($(nproc) cores," \
     "load average now $(cut -d' ' -f1-3 /proc/loadavg))"
echo
"$PY" "$HERE/compare.py" "$OUT" | tee "$OUT/compare.md"
exit "$rc"
