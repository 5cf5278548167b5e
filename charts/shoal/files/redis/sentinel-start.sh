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

primary_host=''
primary_port=''
for sentinel in $SENTINELS; do
  [ "$sentinel" = "$SELF:$SENTINEL_PORT" ] && continue
  answer=$(redis-cli -h "${sentinel%:*}" -p "${sentinel##*:}" --no-auth-warning \
    SENTINEL get-master-addr-by-name "$SERVICE" 2>/dev/null) || continue
  host=$(printf '%s\n' "$answer" | sed -n 1p)
  port=$(printf '%s\n' "$answer" | sed -n 2p)
  case "$port" in
    ''|*[!0-9]*) continue ;;
  esac
  primary_host=$host
  primary_port=$port
  break
done
if [ -z "$primary_host" ]; then
  primary_host=${FIRST_NODE%:*}
  primary_port=${FIRST_NODE##*:}
fi

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
