#!/usr/bin/env bash
# bench/peers.sh - Shoal and RabbitMQ interleaved in one sitting: ROUNDS rounds of bench/run.sh
# then /work/shared/tools/run-peer-bench.sh rabbitmq (A B A B ...), one repetition per row per
# round, so both see the same machine over the same minutes. Prints the medians over rounds and
# the Shoal/RabbitMQ ratio per row (bench/compare.py).
#
# usage: bench/peers.sh [OUTDIR]
#
# Environment: ROUNDS (3); N, NFAN, NLAT, RATE, BACKLOG, SIZE are passed to both (defaults
# below); ROWS selects Shoal's rows (see run.sh); PY (python with python-qpid-proton, default
# .venv/bin/python), AMQPLOAD and PEER_BENCH (default /work/shared/tools/run-peer-bench.sh).
#
# RabbitMQ comes from Debian's rabbitmq-server package (3.10, with the rabbitmq_amqp1_0
# plugin that run-peer-bench.sh enables in its private state directory). It listens on
# 127.0.0.1:5672, which must be free. Its "i-durable" row (durable queue, persistent messages)
# pairs with Shoal's (SHOAL_DURABILITY=fsync, Redis appendfsync always).
#
# Each round's share of the machine (busy and steal %, from /proc/stat) goes to machine.json
# beside its results, and compare.py prints it per round: a VM's steal moves the p99 row.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
OUT=${1:-/tmp/shoal-bench/peers-$(date +%Y%m%d-%H%M%S)}
PEER_BENCH=${PEER_BENCH:-/work/shared/tools/run-peer-bench.sh}
ROUNDS=${ROUNDS:-3}
export PY=${PY:-$ROOT/.venv/bin/python}
export N=${N:-50000} NFAN=${NFAN:-20000} NLAT=${NLAT:-10000} RATE=${RATE:-1000}
export BACKLOG=${BACKLOG:-1000} SIZE=${SIZE:-1024} REPS=1
mkdir -p "$OUT"

rabbit=1
if ! command -v rabbitmq-server > /dev/null && [[ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
  rabbit=0
  cat >&2 <<'EOT'
rabbitmq-server is not installed, so only Shoal is measured. To add RabbitMQ (Debian 12):
  sudo apt-get install --no-install-recommends rabbitmq-server
(in a container, keep /usr/sbin/policy-rc.d exiting 101 so the package does not start a node
of its own on 0.0.0.0:5672; run-peer-bench.sh starts a private one on 127.0.0.1).
EOT
fi

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
  if ((rabbit)); then
    echo "=== round $round of $ROUNDS: RabbitMQ ($(cut -d' ' -f1-3 /proc/loadavg))"
    # run-peer-bench.sh bounds every run itself and stops RabbitMQ (and its epmd) by PID
    measured "$OUT/rabbitmq-$round" \
        timeout -k 30 3600 bash "$PEER_BENCH" rabbitmq "$OUT/rabbitmq-$round" || rc=$?
  fi
done

echo
echo "## Shoal beside RabbitMQ: medians of $ROUNDS interleaved rounds ($(nproc) cores," \
     "load average now $(cut -d' ' -f1-3 /proc/loadavg))"
echo
"$PY" "$HERE/compare.py" "$OUT" | tee "$OUT/compare.md"
exit "$rc"
