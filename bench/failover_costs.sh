#!/usr/bin/env bash
# bench/failover_costs.sh - the cost table of making a failover invisible, in one run
# (docs/performance.md, "Failover costs in one run"): the 1 -> 1 at-least-once row, with
# Qpid-JMS-shaped message-ids, in `memory` durability with duplicate detection off and on, and in
# `replicated` durability without durable fetches and acks (a copy of the tree with them cut out,
# bench/strip_durable_deliveries.py: there is no setting for them), with them (the tree as it
# is) and with duplicate detection on too. Rates first (bench/replicated.sh: a fresh primary and
# replica per run, the five rows interleaved, REPS rounds), then instructions per message of the
# broker (bench/instructions.sh under callgrind, REPLICA=1, the four rows interleaved): counts,
# which a machine shared with other work does not move as it moves rates.
#
# usage: bench/failover_costs.sh            (from the checkout; its broker/ is the tree measured)
# Environment: REPS (3), N (20000), WARMUP (2000), IREPS (3), IN (2000), IWARMUP (1000), PY,
# BROKER_PY. Loopback only; the scripts it runs stop every process they start, by PID.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
ROW="--max-backlog 200 --message-ids"
STRIPPED=$(mktemp -d /tmp/shoal-stripped.XXXXXX)
trap 'rm -rf "$STRIPPED"' EXIT
cp -r "$ROOT/broker" "$STRIPPED/broker"
"$PY" "$HERE/strip_durable_deliveries.py" "$STRIPPED/broker"

echo "== rates (bench/replicated.sh), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
REPS=${REPS:-3} N=${N:-20000} WARMUP=${WARMUP:-2000} ROW=$ROW "$HERE/replicated.sh" \
  "$ROOT/broker:SHOAL_DURABILITY=memory" \
  "$ROOT/broker:SHOAL_DURABILITY=memory,SHOAL_DUPLICATE_DETECTION=true" \
  "$STRIPPED/broker" \
  "$ROOT/broker" \
  "$ROOT/broker:SHOAL_DUPLICATE_DETECTION=true"

echo "== instructions (bench/instructions.sh), load average $(cut -d' ' -f1-3 /proc/loadavg)"
REPLICA=1 REPS=${IREPS:-3} N=${IN:-2000} WARMUP=${IWARMUP:-1000} ROW=$ROW \
  "$HERE/instructions.sh" \
  "$ROOT/broker" \
  "$ROOT/broker:SHOAL_DUPLICATE_DETECTION=true" \
  "$STRIPPED/broker:SHOAL_DURABILITY=replicated" \
  "$ROOT/broker:SHOAL_DURABILITY=replicated"
