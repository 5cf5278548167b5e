#!/usr/bin/env bash
# bench/groups.sh - message groups in broker instructions per message (bench/instructions.sh,
# callgrind). First the cost groups put on ungrouped traffic: this tree against BASE (a commit
# without message groups, extracted with `git archive`), on the 1 -> 1 at-least-once and the
# presettled rows. Then, on this tree in the same run, grouped traffic (1 000 groups in turn,
# bench/load.py --groups 1000) beside ungrouped traffic, at-least-once and presettled.
# docs/performance.md#message-groups has the figures.
#
# usage: bench/groups.sh
# Environment: BASE (1a6ea2d, the last commit without message groups), ROWS (the A/B rows,
# separated by ';'), GROUPED_ROWS (this tree's rows; set empty, none), and instructions.sh's N, WARMUP, REPS, PY.
# Loopback only; instructions.sh stops every process it starts by PID.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
BASE=${BASE:-1a6ea2d}
ROWS=${ROWS:---max-backlog 200;--max-backlog 200 --presettled}
GROUPED_ROWS=${GROUPED_ROWS---max-backlog 200;--max-backlog 200 --groups 1000;--max-backlog 200 --presettled;--max-backlog 200 --presettled --groups 1000}
WORK=$(mktemp -d /tmp/shoal-groups.XXXXXX)
stop_on_exit
instructions_against "$BASE" 'ungrouped; tree 0: base, no groups; tree 1: this'
IFS=';' read -r -a rows <<< "$GROUPED_ROWS"
for row in "${rows[@]}"; do
  echo
  echo "### this tree, ROW=\"$row\""
  ROW="$row" "$HERE/instructions.sh" "$ROOT/broker"
done
