#!/usr/bin/env bash
# bench/idle.sh - COUNT idle AMQP connections held against one Shoal replica (bench/idle.py):
# connections opened, failed or dropped, and the broker's memory per connection.
#
# usage: bench/idle.sh            Environment: COUNT (5000), HOLD (30 s), PY
# Starts its own redis-server and broker on free loopback ports; stops them by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
ROOT=$(cd "$HERE/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
COUNT=${COUNT:-5000}; HOLD=${HOLD:-30}
WORK=$(mktemp -d /tmp/shoal-idle.XXXXXX)
stop_on_exit

read -r RPORT APORT HPORT < <(free_ports 3)
redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no --dir "$WORK" \
    --logfile "$WORK/redis.log" --daemonize no > /dev/null 2>&1 &
STARTED_PIDS+=($!)
for ((t = 0; t < 100; t++)); do redis-cli -p "$RPORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
SHOAL_LOG_LEVEL=WARNING "$PY" -m shoal_broker --listen "127.0.0.1:$APORT" --http "127.0.0.1:$HPORT" \
    --redis-url "redis://127.0.0.1:$RPORT/0" --replica-id idle > "$WORK/broker.log" 2>&1 &
BROKER_PID=$!; STARTED_PIDS+=("$BROKER_PID")
for ((t = 0; t < 300; t++)); do curl -sf "http://127.0.0.1:$HPORT/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg); $COUNT connections, held ${HOLD}s"
rc=0
timeout -k 10 $((HOLD + 300)) "$PY" "$HERE/idle.py" --port "$APORT" --broker-pid "$BROKER_PID" \
  --count "$COUNT" --hold "$HOLD" || rc=$?
curl -sf "http://127.0.0.1:$HPORT/readyz" > /dev/null && echo "broker ready afterwards: yes" \
  || { echo "broker ready afterwards: NO"; rc=1; }
errors=$(grep -c -E 'ERROR|CRITICAL|Traceback' "$WORK/broker.log" || true)
echo "broker log lines with ERROR/CRITICAL/Traceback: $errors"
exit "$rc"
