#!/usr/bin/env bash
# bench/sched.sh - where the machine's CPU time goes in the middle of one saturating row: each
# process's share of a CPU (broker, Redis, the load generator's processes), the machine's idle
# share, and who ran in the time bins where a CPU sat idle (bench/sched.py, from perf sched).
# A closed-loop row leaves ~13 % of two vCPUs idle with no process of the chain at its limit
# (docs/performance.md#idle-cpu); this is how that is measured.
#
# usage: bench/sched.sh [bench/load.py options]    default: the presettled row,
#                                               "--max-backlog 1000 --presettled"
# Environment: N (150000 messages: long enough to record inside it), DELAY (2.5 s into the run),
# WINDOW (1 s recorded), BIN_MS (2), ENV (extra broker environment), PY, RUN_TIMEOUT.
# Needs perf (linux-perf) and the right to record scheduler events (root here).
# Starts its own redis-server and broker on free loopback ports; stops them by PID on exit.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${N:-150000}; DELAY=${DELAY:-2.5}; WINDOW=${WINDOW:-1}; BIN_MS=${BIN_MS:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
(($# > 0)) || set -- --max-backlog 1000 --presettled
command -v perf > /dev/null || { echo "perf is not installed" >&2; exit 2; }
# shellcheck disable=SC2086
[[ -z ${ENV:-} ]] || export ${ENV?}
start_stack sched

load() {
  timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/load.py" run --port "$APORT" \
      --timeout "$RUN_TIMEOUT" --size 1024 "$@"
}
descendants() {  # every process under PID, depth first
  local child
  for child in $(ps -o pid= --ppid "$1"); do echo "$child"; descendants "$child"; done
}

load -a warmup -n 5000 "$@" > /dev/null
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg); $N messages, $*"
load -a sched -n "$N" "$@" > "$WORK/load.txt" 2>&1 &
LOAD_PID=$!; STARTED_PIDS+=("$LOAD_PID")
sleep "$DELAY"
# load.py's main process forks its consumers, then its producer (a fork context): in that order
loaders=()
for pid in $(descendants "$LOAD_PID"); do
  [[ $(ps -o comm= -p "$pid" 2> /dev/null) == python* ]] && loaders+=("$pid")
done
names=(--name "$BROKER_PID=broker" --name "$REDIS_PID=redis")
((${#loaders[@]} >= 3)) || { echo "load.py's processes not found: ${loaders[*]}" >&2; exit 1; }
names+=(--name "${loaders[0]}=load main" --name "${loaders[-1]}=load producer")
for pid in "${loaders[@]:1:${#loaders[@]}-2}"; do names+=(--name "$pid=load consumer"); done
m0=$(cpu_ticks)
perf sched record -q -o "$WORK/sched.data" -- sleep "$WINDOW" > /dev/null 2>&1
m1=$(cpu_ticks)
wait "$LOAD_PID" || { cat "$WORK/load.txt" >&2; echo "the load run failed" >&2; exit 1; }
grep 'rep median' "$WORK/load.txt"
echo "busy and steal over the window (%): $(machine_share "$m0" "$m1")"
echo
perf sched timehist -i "$WORK/sched.data" 2> /dev/null \
  | "$PY" "$HERE/sched.py" --cpus "$(nproc)" --bin-ms "$BIN_MS" "${names[@]}"
