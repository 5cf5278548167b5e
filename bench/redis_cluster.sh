# bench/redis_cluster.sh - sourced by bench scripts (after lib.sh) that run brokers on a Redis
# Cluster of their own: start one, read what each shard did, stop it by PID.
#
#   cluster_up SHARDS DIR   SHARDS cluster-enabled primaries on free loopback ports (client and
#                           bus port each), no replicas, no persistence. Each node takes one
#                           contiguous range of the slots (bench/slots.py ranges) with
#                           ADDSLOTSRANGE and CLUSTER MEET joins them: `redis-cli --cluster
#                           create` wants at least three primaries, this makes 1, 2 or more the
#                           same way. Returns once every node says cluster_state:ok with all
#                           16 384 slots served and every node known (30 s at most).
#                           SHARDS 0: one plain redis-server (a standalone baseline).
#                           Sets CLUSTER_PIDS, CLUSTER_PORTS (arrays, one per node) and
#                           CLUSTER_URL (redis+cluster://every node, or redis:// for 0).
#   cluster_sample          one line per node: CPU seconds (utime + stime, /proc/PID/stat),
#                           commands processed, MOVED and ASK and CROSSSLOT error replies
#                           (INFO errorstats), keys (DBSIZE)
#   cluster_commandstats    every node's INFO commandstats, each line prefixed with its port
#   cluster_down            stops the nodes by PID (TERM, KILL after 15 s)
#
# No replicas: what the bench measures is throughput and CPU per message; a replica would add
# its primary's replication stream and a process of its own on the same cores.

CLUSTER_PIDS=(); CLUSTER_PORTS=(); CLUSTER_URL=""

_cluster_cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$@"; }

_cluster_ok() {  # _cluster_ok NODES: every node sees the whole cluster, every slot served
  local nodes=$1 port info
  for port in "${CLUSTER_PORTS[@]}"; do
    info=$(_cluster_cli "$port" CLUSTER INFO 2>/dev/null | tr -d '\r') || return 1
    grep -qx 'cluster_state:ok' <<< "$info" && grep -qx 'cluster_slots_ok:16384' <<< "$info" \
      && grep -qx "cluster_known_nodes:$nodes" <<< "$info" || return 1
  done
}

cluster_up() {
  local shards=$1 dir=$2 i port bus t
  local -a ranges buses=()
  CLUSTER_PIDS=(); CLUSTER_PORTS=(); CLUSTER_URL=""
  if ((shards == 0)); then
    read -r port < <(free_ports 1)
    mkdir -p "$dir/node-0"
    start_redis "$port" "$dir/node-0" --appendonly no || return 1
    CLUSTER_PIDS=("$REDIS_PID"); CLUSTER_PORTS=("$port"); CLUSTER_URL=redis://127.0.0.1:$port/0
    return 0
  fi
  read -r -a ranges < <("$PY" "$HERE/slots.py" ranges "$shards")
  for ((i = 0; i < shards; i++)); do
    read -r port bus < <(free_ports 2)
    mkdir -p "$dir/node-$i"
    start_redis "$port" "$dir/node-$i" --appendonly no --cluster-enabled yes \
        --cluster-config-file nodes.conf --cluster-port "$bus" || return 1
    CLUSTER_PIDS+=("$REDIS_PID"); CLUSTER_PORTS+=("$port"); buses+=("$bus")
    _cluster_cli "$port" CLUSTER SET-CONFIG-EPOCH $((i + 1)) | grep -q OK || return 1
    _cluster_cli "$port" CLUSTER ADDSLOTSRANGE "${ranges[i]%-*}" "${ranges[i]#*-}" \
      | grep -q OK || return 1
  done
  for ((i = 1; i < shards; i++)); do
    _cluster_cli "${CLUSTER_PORTS[i]}" CLUSTER MEET 127.0.0.1 "${CLUSTER_PORTS[0]}" "${buses[0]}" \
      | grep -q OK || return 1
  done
  CLUSTER_URL=redis+cluster://$(printf '127.0.0.1:%s,' "${CLUSTER_PORTS[@]}")
  CLUSTER_URL=${CLUSTER_URL%,}
  for ((t = 0; t < 300; t++)); do _cluster_ok "$shards" && return 0; sleep 0.1; done
  echo "the cluster of $shards did not form (see $dir/node-*/redis.log)" >&2
  return 1
}

cluster_sample() {
  local i port
  for i in "${!CLUSTER_PORTS[@]}"; do
    port=${CLUSTER_PORTS[i]}
    printf '%s ' "$(proc_cpu_s "${CLUSTER_PIDS[i]}")"
    { _cluster_cli "$port" INFO stats; _cluster_cli "$port" INFO errorstats
      echo "keys:$(_cluster_cli "$port" DBSIZE)"; } | tr -d '\r' | awk -F'[:=,]' '
      $1 == "total_commands_processed" { c = $2 }
      $1 == "errorstat_MOVED" { m = $3 }
      $1 == "errorstat_ASK" { a = $3 }
      $1 == "errorstat_CROSSSLOT" { x = $3 }
      $1 == "keys" { k = $2 }
      END { print c + 0, m + 0, a + 0, x + 0, k + 0 }'
  done
}

cluster_commandstats() {
  local port
  for port in "${CLUSTER_PORTS[@]}"; do
    _cluster_cli "$port" INFO commandstats | tr -d '\r' | grep '^cmdstat_' | sed "s/^/$port /"
  done
}

cluster_down() {
  local i pid t
  for ((i = ${#CLUSTER_PIDS[@]} - 1; i >= 0; i--)); do
    pid=${CLUSTER_PIDS[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for ((t = 0; t < 150; t++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  done
  local kept=() gone=" ${CLUSTER_PIDS[*]} "  # the exit's clean-up must not signal a reused PID
  for pid in "${STARTED_PIDS[@]}"; do [[ $gone == *" $pid "* ]] || kept+=("$pid"); done
  STARTED_PIDS=("${kept[@]}")
  CLUSTER_PIDS=(); CLUSTER_PORTS=(); CLUSTER_URL=""
}
