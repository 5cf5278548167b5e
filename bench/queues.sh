#!/usr/bin/env bash
# bench/queues.sh - COUNT idle queues on one Shoal replica (bench/queues.py): the broker's and
# Redis's CPU over SPAN seconds, metric records appended per interval, one backlog refresh timed.
#
# usage: bench/queues.sh          Environment: COUNT (10000), SPAN (60 s), REPLICAS (1 or 2), PY
# Starts its own redis-server and broker(s) on free loopback ports; stops them by PID on exit.
# With REPLICAS=2 a second replica (a larger id: it reads the first one's shared backlog) runs too.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
COUNT=${COUNT:-10000}; SPAN=${SPAN:-60}
export SHOAL_METRICS_INTERVAL_SECONDS=${SHOAL_METRICS_INTERVAL_SECONDS:-10}
start_stack queues
peer=()
if [[ ${REPLICAS:-1} == 2 ]]; then
  read -r APORT2 HPORT2 < <(free_ports 2)
  start_broker "$APORT2" "$HPORT2" "$RPORT" queues-z "$WORK/broker-z.log"
  peer=(--peer-pid "$BROKER_PID")
  BROKER_PID=${STARTED_PIDS[1]}
fi
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg); $COUNT idle queues," \
     "measured ${SPAN}s"
timeout -k 10 $((SPAN + 600)) "$PY" "$HERE/queues.py" --redis-url "redis://127.0.0.1:$RPORT/0" \
  --broker-pid "$BROKER_PID" --redis-pid "$REDIS_PID" --count "$COUNT" --seconds "$SPAN" \
  --interval "$SHOAL_METRICS_INTERVAL_SECONDS" "${peer[@]}"
errors=$(grep -c -E 'ERROR|CRITICAL|Traceback' "$WORK/broker.log" || true)
echo "broker log lines with ERROR/CRITICAL/Traceback: $errors"
