#!/usr/bin/env bash
# bench/tracing_cost.sh - what broker spans cost a message on the 1 -> 1 at-least-once row, in
# broker instructions per message (bench/instructions.sh: callgrind, idle-corrected), all trees
# in one run, interleaved, REPS runs each; docs/performance.md#tracing holds the results.
#
# The trees, every message carrying a sampled W3C traceparent (bench/load.py --traceparent):
#   0 this checkout's broker with its tracing hooks cut out (bench/strip_tracing.py): the same
#     code, tracing absent
#   1 the commit before tracing landed (BASE; `git archive` of it, from this repository's own
#     history): for reference, it also lacks every change made since
#   2 this checkout, tracing off (the default)
#   3 tracing on, SHOAL_TRACING_SAMPLE_RATIO=0.01
#   4 tracing on, every message sampled
# First, one hook's own cost with tracing off (bench/hook_cost.py under callgrind): the bound
# that does not depend on the end-to-end runs' spread.
# Spans go to a loopback OTLP/HTTP sink (bench/otlp_sink.py) that keeps nothing, exported every
# 2 s (OTEL_BSP_SCHEDULE_DELAY), well within instructions.sh's SETTLE and TAIL.
#
# usage: bench/tracing_cost.sh        Environment: REPS (5), N (2000), WARMUP (1000), IDLE (10),
#   BASE (default: the parent of the commit that added broker/shoal_broker/tracing/), TREES
#   ("0 1 2 3 4"), and what bench/instructions.sh reads. Loopback only; every process started
#   is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
export REPS=${REPS:-5}
read -r -a TREES <<< "${TREES:-0 1 2 3 4}"

WORK=$(mktemp -d /tmp/shoal-tracing-cost.XXXXXX)
stop_on_exit

if [[ -z ${BASE:-} ]]; then
  added=$(git -C "$ROOT" log --diff-filter=A --format=%H -- broker/shoal_broker/tracing/__init__.py \
          | tail -1)
  [[ -n $added ]] || { echo "no commit adds broker/shoal_broker/tracing/ (a shallow clone?)" >&2; exit 2; }
  BASE=$added^
fi
BASE=$(git -C "$ROOT" rev-parse --verify "$BASE^{commit}")
mkdir -p "$WORK/base" "$WORK/absent"
git -C "$ROOT" archive "$BASE" broker | tar -x -C "$WORK/base"
# the checkout's broker as it is (working tree and its compiled C hot path included, so that
# both trees run the same binary), its tracing hooks then cut out
build_wire "$ROOT/broker"
tar -C "$ROOT" --exclude='__pycache__' -cf - broker | tar -x -C "$WORK/absent"
"$PY" "$HERE/strip_tracing.py" "$WORK/absent/broker"

# one hook's own cost on the broker's interpreter (bench/hook_cost.py), free of batching and noise
for variant in hooked bare; do
  for n in 0 1000000; do
    valgrind --tool=callgrind --callgrind-out-file="$WORK/hook.$variant.$n" \
        "$BROKER_PY" "$HERE/hook_cost.py" "$variant" "$n" 2> /dev/null
  done
done
"$PY" - "$WORK" <<'PY'
import re, sys
def total(name):
    return int(re.search(r'^summary: (\d+)', open(f'{sys.argv[1]}/{name}').read(), re.M).group(1))
per = {v: (total(f'hook.{v}.1000000') - total(f'hook.{v}.0')) / 1e6 for v in ('hooked', 'bare')}
hook = per['hooked'] - per['bare']
print(f'one hook with tracing off: {hook:.0f} instructions (a call with it {per["hooked"]:.0f}, '
      f'without {per["bare"]:.0f}); a message accepted on the 1 -> 1 row passes at most 4 '
      f'(publish, store answer, delivery, accept): at most {4 * hook:.0f} per message')
PY

read -r sink_port < <(free_ports 1)
"$PY" "$HERE/otlp_sink.py" "$sink_port" &
STARTED_PIDS+=("$!")

trees=()
for t in "${TREES[@]}"; do
  case $t in
    0) trees+=("$WORK/absent/broker") ;;
    1) trees+=("$WORK/base/broker") ;;
    2) trees+=("$ROOT/broker") ;;
    3) trees+=("$ROOT/broker:SHOAL_TRACING=true,SHOAL_TRACING_SAMPLE_RATIO=0.01") ;;
    4) trees+=("$ROOT/broker:SHOAL_TRACING=true") ;;
    *) echo "unknown tree $t (0-4)" >&2; exit 2 ;;
  esac
done
echo "base: $(git -C "$ROOT" log -1 --format='%h %s' "$BASE")"
echo "this: $(git -C "$ROOT" log -1 --format='%h %s')$(git -C "$ROOT" status --porcelain -- broker \
     | grep -q . && echo ' (broker/ modified)')"
ROW="--max-backlog 200 --traceparent" \
  ENV="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$sink_port OTEL_BSP_SCHEDULE_DELAY=2000 ${ENV:-}" \
  bash "$HERE/instructions.sh" "${trees[@]}"
