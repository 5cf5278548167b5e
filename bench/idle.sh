#!/usr/bin/env bash
# bench/idle.sh - COUNT idle AMQP connections held against one Shoal replica (bench/idle.py):
# connections opened, failed or dropped, and the broker's memory per connection.
#
# usage: bench/idle.sh            Environment: COUNT (5000), HOLD (30 s), PY
# Starts its own redis-server and broker on free loopback ports; stops them by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
COUNT=${COUNT:-5000}; HOLD=${HOLD:-30}
start_stack idle
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg); $COUNT connections, held ${HOLD}s"
rc=0
timeout -k 10 $((HOLD + 300)) "$PY" "$HERE/idle.py" --port "$APORT" --broker-pid "$BROKER_PID" \
  --count "$COUNT" --hold "$HOLD" || rc=$?
curl -sf "http://127.0.0.1:$HPORT/readyz" > /dev/null && echo "broker ready afterwards: yes" \
  || { echo "broker ready afterwards: NO"; rc=1; }
errors=$(grep -c -E 'ERROR|CRITICAL|Traceback' "$WORK/broker.log" || true)
echo "broker log lines with ERROR/CRITICAL/Traceback: $errors"
exit "$rc"
