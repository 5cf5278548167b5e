#!/usr/bin/env bash
# bench/rabbitmq.sh - the peer for the side-by-side comparison: a private RabbitMQ node, the same
# rows as bench/run.sh through bench/load.py, then the node stopped. RabbitMQ is Debian's
# rabbitmq-server package (3.10) with its rabbitmq_amqp1_0 plugin; when missing it is installed
# with apt (see ensure_rabbitmq below: the package's own service is kept from starting).
#
# usage: bench/rabbitmq.sh [OUTDIR]      (bench/peers.sh runs it interleaved with run.sh)
#
# The node is private: its state, logs, cookie and plugin list live in a fresh temporary
# directory, it listens on 127.0.0.1 only, on free ports (AMQP, Erlang distribution and a
# private epmd), and every process it starts (the server script, beam, epmd) is stopped by PID
# on exit. Environment as for run.sh: N, NFAN, NLAT, RATE, REPS, WARMUP, BACKLOG, SIZE,
# RUN_TIMEOUT, PY, QUICK; ROWS picks rows among "i ii iii v iv d" (RabbitMQ has no JMS shared
# subscriptions, so no "s"). Addresses follow the plugin's scheme: /queue/NAME (a queue),
# /topic/KEY (amq.topic, one queue per subscriber); the durable row uses a durable queue and
# persistent messages.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
row_defaults
ROWS=" ${ROWS:-i ii iii v iv d} "
OUT=${1:-/tmp/shoal-bench/rabbitmq-$(date +%Y%m%d-%H%M%S)}
# shellcheck source=bench/rabbit_node.sh
. "$HERE/rabbit_node.sh"

ensure_rabbitmq
"$PY" -c 'import cproton_ffi' 2>/dev/null || { echo "$PY lacks python-qpid-proton" >&2; exit 2; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/shoal-rabbitmq.XXXXXX)
CLEANUP_MESSAGE="RabbitMQ stopped; results in $OUT"
read -r AMQP_PORT DIST_PORT EPMD_PORT < <(free_ports 3)
NODE=shoal-bench-$$@localhost

trap _rabbit_cleanup EXIT
trap 'exit 130' INT TERM
start_rabbitmq

{
  echo "rabbitmq: $(date -Is) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "N=$N NFAN=$NFAN NLAT=$NLAT RATE=$RATE REPS=$REPS WARMUP=$WARMUP BACKLOG=$BACKLOG SIZE=$SIZE"
} | tee "$OUT/machine.txt"

J="$OUT/results.jsonl"
: > "$J"  # this run's rows only: an OUTDIR used before must not add its runs to the medians
FAILED=()
bench() {  # label, then bench/load.py run options
  local label=$1
  shift
  echo "--- $label"
  timeout -k 10 $(((REPS + 1) * (RUN_TIMEOUT + 30) + 60)) "$PY" "$HERE/load.py" run \
      --port "$AMQP_PORT" --timeout "$RUN_TIMEOUT" --reps "$REPS" --size "$SIZE" \
      --broker-pid "$BEAM_PID" --label "rabbitmq $label" --json "$J" "$@" 2>&1 \
    | tee -a "$OUT/log.txt" || { echo "($label: incomplete or failed)"; FAILED+=("$label"); }
}
row() { [[ $ROWS == *" $1 "* ]]; }

Q='/queue/bench-{run}'
row i && bench "i queue 1p1c at-least-once" -a "$Q" -n "$N" --max-backlog "$BACKLOG" \
  --warmup "$WARMUP"
row ii && bench "ii queue 1p1c presettled" -a "$Q" -n "$N" --max-backlog "$BACKLOG" --presettled
row iii && bench "iii queue 1p4c competing" -a "$Q" -n "$N" --max-backlog "$BACKLOG" -k 4
row v && bench "v latency @${RATE}/s" -a "$Q" -n "$NLAT" --rate "$RATE" --max-backlog "$BACKLOG"
row iv && bench "iv topic fan-out 1p4s" -a '/topic/bench.{run}' -n "$NFAN" \
  --max-backlog "$BACKLOG" -k 4 --fanout
row d && bench "i-durable queue 1p1c at-least-once" -a '/queue/bench-d-{run}' -n "$N" \
  --max-backlog "$BACKLOG" --durable

touch "$J"
"$PY" "$HERE/load.py" table "$J" | tee "$OUT/table.md"
if ((${#FAILED[@]})); then
  echo "incomplete or failed rows: ${FAILED[*]}" >&2
  exit 1
fi
