#!/usr/bin/env bash
# bench/connection_memory.sh - broker memory per AMQP connection (bench/connection_memory.py):
# for each of COUNTS and each link set (session only, sender, receiver, both), a fresh
# redis-server and broker, COUNT connections opened and attached, the broker's RSS per
# connection; then proton-c's own share, measured in one process.
#
# usage: bench/connection_memory.sh     Environment: COUNTS ("500 2000"), LINKS, PY
# Starts its own redis-server and broker on free loopback ports; stops them by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
COUNTS=${COUNTS:-500 2000}; LINKS=${LINKS:-none sender receiver both}
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
for count in $COUNTS; do
  for links in $LINKS; do
    ( start_stack connmem
      timeout -k 10 300 "$PY" "$HERE/connection_memory.py" --port "$APORT" \
        --broker-pid "$BROKER_PID" --count "$count" --links "$links" )
  done
  for links in $LINKS; do
    timeout -k 10 120 "$PY" "$HERE/connection_memory.py" --proton-only --count "$count" --links "$links"
  done
done
