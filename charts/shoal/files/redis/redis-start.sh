#!/bin/sh
# Starts one Redis node of a Sentinel-watched group (POSIX sh: busybox in the image, dash in tests).
# A node asks the sentinels for the current primary first, so that a node that comes back after a
# failover (the first node included) starts as a replica of the promoted one and never as a
# second primary; while no sentinel answers (the first start), the first node is the primary and
# every other node replicates it.
#   SELF           the address this node announces (its stable DNS name)
#   REDIS_PORT     its port
#   FIRST_NODE     host:port of the first node, the primary of a group no sentinel knows yet
#   SENTINELS      the sentinels, host:port separated by spaces
#   SERVICE        the name the sentinels monitor the primary under
#   REDIS_PASSWORD optional: required by the nodes (and the sentinels); REDISCLI_AUTH for redis-cli
# Arguments: redis-server's own (data directory, persistence, ...).
set -eu

# shellcheck source=find-primary.sh source-path=SCRIPTDIR
. "$(dirname "$0")/find-primary.sh"
find_primary ''  # a node skips no sentinel

set -- "$@" --port "$REDIS_PORT" --replica-announce-ip "$SELF" --replica-announce-port "$REDIS_PORT" \
  --protected-mode no
if [ -n "${REDIS_PASSWORD:-}" ]; then
  set -- "$@" --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD"
fi
if [ "$primary_host:$primary_port" != "$SELF:$REDIS_PORT" ]; then
  echo "starting as a replica of $primary_host:$primary_port"
  set -- "$@" --replicaof "$primary_host" "$primary_port"
else
  echo "starting as the primary"
fi
exec redis-server "$@"
