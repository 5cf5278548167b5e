#!/bin/sh
# Starts one sentinel. It monitors the primary the other sentinels name (a sentinel restarted
# after a failover must not watch the old primary), or the first node while none answers, and
# writes its configuration where it may rewrite it (Sentinel keeps its state in that file).
#   SELF              the address this sentinel announces (its stable DNS name)
#   SENTINEL_PORT     its port
#   SENTINELS         every sentinel, host:port separated by spaces (itself included)
#   FIRST_NODE        host:port of the first Redis node
#   SERVICE, QUORUM, DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS
#   CONFIG            the file to write
#   REDIS_PASSWORD    optional: the nodes' password, required by this sentinel too
# Arguments: more of redis-server's own.
set -eu

# shellcheck source=find-primary.sh source-path=SCRIPTDIR
. "$(dirname "$0")/find-primary.sh"
find_primary "$SELF:$SENTINEL_PORT"

{
  echo "port $SENTINEL_PORT"
  echo "protected-mode no"
  echo "sentinel resolve-hostnames yes"
  echo "sentinel announce-hostnames yes"
  echo "sentinel announce-ip $SELF"
  echo "sentinel announce-port $SENTINEL_PORT"
  echo "sentinel monitor $SERVICE $primary_host $primary_port $QUORUM"
  echo "sentinel down-after-milliseconds $SERVICE $DOWN_AFTER_MS"
  echo "sentinel failover-timeout $SERVICE $FAILOVER_TIMEOUT_MS"
  echo "sentinel parallel-syncs $SERVICE 1"
  if [ -n "${REDIS_PASSWORD:-}" ]; then
    echo "sentinel auth-pass $SERVICE \"$REDIS_PASSWORD\""
    echo "requirepass \"$REDIS_PASSWORD\""
  fi
} > "$CONFIG"
echo "monitoring $SERVICE at $primary_host:$primary_port"
exec redis-server "$CONFIG" --sentinel "$@"
