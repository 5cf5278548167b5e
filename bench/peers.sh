#!/usr/bin/env bash
# bench/peers.sh - Shoal and RabbitMQ measured in one sitting: bench/run.sh, then the shared
# /work/shared/tools/run-peer-bench.sh rabbitmq with the same message counts and repetitions.
# Quote same-run ratios from its output, not ratios against figures from another day.
#
# usage: bench/peers.sh [OUTDIR]
#
# Environment: N, NFAN, NLAT, RATE, REPS, BACKLOG, SIZE are passed to both (defaults below);
# PY (python with python-qpid-proton, default .venv/bin/python), AMQPLOAD and PEER_BENCH
# (default /work/shared/tools/run-peer-bench.sh) are overridable.
#
# RabbitMQ comes from Debian's rabbitmq-server package (3.10, with the rabbitmq_amqp1_0
# plugin that run-peer-bench.sh enables in its private state directory). It listens on
# 127.0.0.1:5672, which must be free.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=${1:-/tmp/shoal-bench/peers-$(date +%Y%m%d-%H%M%S)}
PEER_BENCH=${PEER_BENCH:-/work/shared/tools/run-peer-bench.sh}
export PY=${PY:-$ROOT/.venv/bin/python}
export N=${N:-50000} NFAN=${NFAN:-20000} NLAT=${NLAT:-10000} RATE=${RATE:-1000}
export REPS=${REPS:-3} BACKLOG=${BACKLOG:-1000} SIZE=${SIZE:-1024}
mkdir -p "$OUT"

rc=0
bash "$HERE/run.sh" "$OUT/shoal" || rc=$?

if command -v rabbitmq-server > /dev/null || [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
  # run-peer-bench.sh bounds every run itself (--timeout 60 per process, `timeout` per step)
  # and stops RabbitMQ (and the epmd it started) by PID on exit.
  timeout -k 30 3600 bash "$PEER_BENCH" rabbitmq "$OUT/rabbitmq" || rc=$?
else
  cat >&2 <<'EOF'
rabbitmq-server is not installed, so only Shoal was measured. To add RabbitMQ (Debian 12):
  sudo apt-get install --no-install-recommends rabbitmq-server
(in a container, keep /usr/sbin/policy-rc.d exiting 101 so the package does not start a node
of its own on 0.0.0.0:5672; run-peer-bench.sh starts a private one on 127.0.0.1).
EOF
  exit "$rc"
fi

echo
echo "## One sitting: Shoal, then RabbitMQ (medians of $REPS)"
echo
tables=("$OUT/shoal/results.jsonl")
[[ -f $OUT/rabbitmq/results.jsonl ]] && tables+=("$OUT/rabbitmq/results.jsonl")
"$PY" "${AMQPLOAD:-/work/shared/tools/amqpload.py}" table "${tables[@]}" | tee "$OUT/table.md"
exit "$rc"
