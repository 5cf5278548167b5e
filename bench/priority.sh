#!/usr/bin/env bash
# bench/priority.sh - ten priority levels beside the two bands they replaced, in one run: the
# broker's instructions per message (bench/instructions.sh, callgrind) of this tree and of BASE,
# a commit with two bands, extracted with `git archive` into a temporary directory (nothing
# outside the repository is needed), on the 1 -> 1 at-least-once and the presettled rows, each
# at one priority (4, the default, which the fast paths serve) and with priorities 0-9 in turn
# (bench/load.py --priorities 10). docs/performance.md#priority-levels has the figures.
#
# usage: bench/priority.sh
# Environment: BASE (54a4f8c, the last commit with two bands), ROWS (the four above, separated
# by ';'), and instructions.sh's N, WARMUP, REPS, PY.
# Loopback only; instructions.sh stops every process it starts by PID.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
BASE=${BASE:-54a4f8c}
ROWS=${ROWS:---max-backlog 200;--max-backlog 200 --presettled;--max-backlog 200 --priorities 10;--max-backlog 200 --presettled --priorities 10}
WORK=$(mktemp -d /tmp/shoal-priority.XXXXXX)
stop_on_exit
instructions_against "$BASE" 'tree 0: base, two bands; tree 1: this, ten levels'
