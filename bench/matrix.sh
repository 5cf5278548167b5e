#!/usr/bin/env bash
# bench/matrix.sh - the scale matrix: how Shoal's cost grows with the number of queues,
# subscriptions, bytes per message, messages stored, connections and replicas, each row beside
# RabbitMQ in the same run where RabbitMQ has a counterpart (Shoal first, then a private RabbitMQ
# node, never both at once). docs/performance.md ("Scale matrix") holds the figures.
#
# usage: bench/matrix.sh ROW [OUTDIR]     ROW: a b c d e f g, or "all" (each row in turn)
#
#   a  QUEUES queues (1000), one producer link and one consumer link on each (bench/load.py
#      --addresses: one producer and one consumer connection carry them): the aggregate rate of
#      a closed loop with ten messages in flight per queue (NA messages), then p99 at RATE_A
#      msg/s in all (NLAT_A messages)
#   b  one topic with SUBS subscriptions ("100 1000"), plain and shared durable (Shoal only:
#      RabbitMQ 3.10 has no JMS shared subscriptions): bench/matrix.py fanout, HELD messages
#      published with no credit (Redis memory and broker RSS per published message; HELD=10000
#      for a memory figure above used_memory's noise), drained, then NB messages through a
#      closed loop: deliveries/s (RabbitMQ: a queue per subscriber on amq.topic, plain only)
#   c  SIZES ("65536 1048576") byte messages 1->1 at-least-once: MB/s (200 MiB in all, at most
#      5 000 messages; 16 MiB in flight)
#   d  a backlog of BACKLOG_N x 1 KiB (default 1 000 000; set what the machine allows) built
#      with no consumer, then drained: publish rate, drain rate, memory per message
#   e  CONNS connections (2000), each sending CONN_RATE (5) msg/s to its own queue for
#      CONN_SECONDS (30): p99, broker RSS and CPU
#   f  the queue and the shared durable subscription with 6 consumers on 1, 2 and 3 replicas of
#      one Redis (bench/shared.py): msg/s, brokers' and Redis's CPU per message (Shoal only)
#   g  rows a and f (f on G_REPLICAS, "1 2") against brokers on a Redis Cluster of SHARDS
#      primaries ("1 2 3"; 0 is a plain redis-server, a baseline in the same run), no replicas
#      (bench/redis_cluster.sh), G_ROUNDS rounds (1) of every shard count in turn: msg/s, broker
#      and Redis CPU per message (Redis summed over the shards), each shard's share of the Redis
#      CPU and commands, MOVED/ASK/CROSSSLOT replies (bench/shards.py; the table at the end).
#      Shoal only: RabbitMQ has no counterpart of shards (row a's RabbitMQ figure stands)
#
# Every load process is bounded by its own --timeout and by `timeout`; every process started
# here (redis-server, brokers, RabbitMQ's server, beam and epmd) is stopped by PID on exit.
# Environment: PY, BROKER_PY (lib.sh), SKIP_RABBITMQ=1 (Shoal alone), the sizes above.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROW=${1:?usage: bench/matrix.sh a|b|c|d|e|f|g|all [OUTDIR]}
OUT=${2:-/tmp/shoal-bench/matrix-$(date +%Y%m%d-%H%M%S)}
if [[ $ROW == all ]]; then
  rc=0
  for row in a b c d e f g; do bash "$0" "$row" "$OUT" || rc=$?; done
  exit "$rc"
fi
[[ $ROW =~ ^[a-g]$ ]] || { echo "unknown row $ROW (a b c d e f g all)" >&2; exit 2; }

QUEUES=${QUEUES:-1000}; NA=${NA:-50000}; RATE_A=${RATE_A:-1000}; NLAT_A=${NLAT_A:-10000}
SUBS=${SUBS:-100 1000}; HELD=${HELD:-1000}; NB=${NB:-2000}
SIZES=${SIZES:-65536 1048576}
BACKLOG_N=${BACKLOG_N:-1000000}
CONNS=${CONNS:-2000}; CONN_RATE=${CONN_RATE:-5}; CONN_SECONDS=${CONN_SECONDS:-30}
REPLICAS=${REPLICAS:-1 2 3}; NF=${NF:-30000}
SHARDS=${SHARDS:-1 2 3}; G_REPLICAS=${G_REPLICAS:-1 2}; G_ROUNDS=${G_ROUNDS:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
# the rows create thousands of addresses and links as one anonymous user: past the defaults
export SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER=${SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER:-1000000}
export SHOAL_MAX_LINKS_PER_SESSION=${SHOAL_MAX_LINKS_PER_SESSION:-100000}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
J="$OUT/matrix.jsonl"
WORK=$(mktemp -d "/tmp/shoal-matrix-$ROW.XXXXXX")
read -r AMQP_PORT DIST_PORT EPMD_PORT < <(free_ports 3)
NODE=shoal-matrix-$$@localhost
# shellcheck source=bench/rabbit_node.sh
. "$HERE/rabbit_node.sh"
CLEANUP_MESSAGE="stopped everything started; results in $J"
trap _rabbit_cleanup EXIT
trap 'exit 130' INT TERM

echo "row $ROW: $(date -Is) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" \
     "shoal $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" | tee -a "$OUT/machine.txt"

stop_pid() {  # stop_pid PID: TERM, then KILL after 15 s
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

SHOAL_PIDS=()
shoal_up() {  # shoal_up REPLICAS: a fresh redis-server and that many brokers on it; sets RPORT,
  # APORTS (one per broker), BPIDS, REDIS_PID
  local n=$1 i aport hport
  read -r RPORT < <(free_ports 1)
  mkdir -p "$WORK/redis-$RPORT"
  start_redis "$RPORT" "$WORK/redis-$RPORT" --appendonly no
  SHOAL_PIDS=("$REDIS_PID"); APORTS=(); BPIDS=()
  for ((i = 1; i <= n; i++)); do
    read -r aport hport < <(free_ports 2)
    start_broker "$aport" "$hport" "$RPORT" "matrix-$i" "$OUT/broker-$ROW-$i.log"
    APORTS+=("$aport"); BPIDS+=("$BROKER_PID"); SHOAL_PIDS+=("$BROKER_PID")
  done
}
shoal_down() {  # brokers first, then their Redis
  local i
  for ((i = ${#SHOAL_PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${SHOAL_PIDS[i]}"; done
  SHOAL_PIDS=()
}
rabbit_up() { ensure_rabbitmq; start_rabbitmq; }
rabbit_down() {
  stop_rabbitmq
  local pid
  for pid in "${STARTED_PIDS[@]}"; do stop_pid "$pid"; done
  BEAM_PID=""
}
peer() { [[ ${SKIP_RABBITMQ:-0} != 1 ]]; }

load() {  # load LABEL PORT BROKER_PID bench/load.py options...: one bench/load.py row
  local label=$1 port=$2 pid=$3
  shift 3
  timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/load.py" run --port "$port" \
      --timeout "$RUN_TIMEOUT" --broker-pid "$pid" --label "$label" --json "$J" "$@" \
    | tail -1 || echo "($label: incomplete or failed)"
}
matrix() {  # matrix ROW bench/matrix.py options...
  timeout -k 10 $((RUN_TIMEOUT + 120)) "$PY" "$HERE/matrix.py" "$@" --timeout "$RUN_TIMEOUT" \
      --json "$J" || echo "(matrix.py $1: incomplete or failed)"
}
redis_stats() {  # redis_stats LABEL: Redis's CPU and command counts so far, as one JSON line
  redis-cli -p "$RPORT" info commandstats | "$PY" -c '
import json, sys
label, cpu, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
stats = {}
for line in sys.stdin.read().splitlines():
    if line.startswith("cmdstat_"):
        name, fields = line[8:].split(":", 1)
        kv = dict(f.split("=") for f in fields.split(","))
        stats[name] = {"calls": int(kv["calls"]), "usec": int(kv["usec"])}
line = json.dumps({"label": label, "redis_cpu_s": cpu, "commandstats": stats})
print(line[:400])
with open(out, "a") as f:
    f.write(line + "\n")
' "$1" "$(proc_cpu_s "$REDIS_PID")" "$J"
}

row_a() {
  shoal_up 1
  load "a shoal ${QUEUES} queues saturation" "${APORTS[0]}" "${BPIDS[0]}" -a 'mxa-{run}' \
      --addresses "$QUEUES" -n "$NA" --max-backlog "$((10 * QUEUES))"
  load "a shoal ${QUEUES} queues @${RATE_A}/s" "${APORTS[0]}" "${BPIDS[0]}" -a 'mxa-{run}' \
      --addresses "$QUEUES" -n "$NLAT_A" --rate "$RATE_A" --max-backlog 1000
  redis_stats "a shoal redis"
  shoal_down
  peer || return 0
  rabbit_up
  load "a rabbitmq ${QUEUES} queues saturation" "$AMQP_PORT" "$BEAM_PID" -a '/queue/mxa-{run}' \
      --addresses "$QUEUES" -n "$NA" --max-backlog "$((10 * QUEUES))"
  load "a rabbitmq ${QUEUES} queues @${RATE_A}/s" "$AMQP_PORT" "$BEAM_PID" \
      -a '/queue/mxa-{run}' --addresses "$QUEUES" -n "$NLAT_A" --rate "$RATE_A" --max-backlog 1000
  rabbit_down
}

row_b() {
  local s run
  for s in $SUBS; do
    SHOAL_DEFAULT_ADDRESS_KIND=topic shoal_up 1
    run=$RANDOM$RANDOM
    matrix fanout --port "${APORTS[0]}" -a "mxb-$run" --subs "$s" --held "$HELD" -n "$NB" \
        --redis-port "$RPORT" --broker-pid "${BPIDS[0]}" --label "b shoal topic $s plain"
    matrix fanout --port "${APORTS[0]}" -a "mxb-shared-$run" --subs "$s" --shared \
        --held "$HELD" -n "$NB" --redis-port "$RPORT" --broker-pid "${BPIDS[0]}" \
        --label "b shoal topic $s shared durable"
    redis_stats "b shoal redis $s"
    shoal_down
    peer || continue
    rabbit_up
    matrix fanout --port "$AMQP_PORT" -a "/topic/mxb.$run" --subs "$s" --held "$HELD" -n "$NB" \
        --broker-pid "$BEAM_PID" --label "b rabbitmq topic $s plain"
    rabbit_down
  done
}

row_c() {
  local size n backlog
  for size in $SIZES; do
    n=$((200 * 1048576 / size)); ((n > 5000)) && n=5000  # 200 MiB, at most 5 000 messages
    backlog=$((16 * 1048576 / size)); ((backlog < 4)) && backlog=4; ((backlog > 200)) && backlog=200
    shoal_up 1
    load "c shoal ${size} B" "${APORTS[0]}" "${BPIDS[0]}" -a 'mxc-{run}' -n "$n" --size "$size" \
        --max-backlog "$backlog"
    redis_stats "c shoal redis ${size} B"
    shoal_down
    peer || continue
    rabbit_up
    load "c rabbitmq ${size} B" "$AMQP_PORT" "$BEAM_PID" -a '/queue/mxc-{run}' -n "$n" \
        --size "$size" --max-backlog "$backlog"
    rabbit_down
  done
}

row_d() {
  local run=$RANDOM$RANDOM
  shoal_up 1
  matrix backlog --port "${APORTS[0]}" -a "mxd-$run" -n "$BACKLOG_N" --redis-port "$RPORT" \
      --broker-pid "${BPIDS[0]}" --label "d shoal backlog $BACKLOG_N"
  redis_stats "d shoal redis"
  shoal_down
  peer || return 0
  rabbit_up
  matrix backlog --port "$AMQP_PORT" -a "/queue/mxd-$run" -n "$BACKLOG_N" \
      --broker-pid "$BEAM_PID" --label "d rabbitmq backlog $BACKLOG_N"
  rabbit_down
}

row_e() {
  local run=$RANDOM$RANDOM
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  shoal_up 1
  matrix conns --port "${APORTS[0]}" -a "mxe-$run" --conns "$CONNS" --rate "$CONN_RATE" \
      --seconds "$CONN_SECONDS" --redis-port "$RPORT" --broker-pid "${BPIDS[0]}" \
      --broker-pid "$REDIS_PID" --label "e shoal $CONNS connections"
  shoal_down
  peer || return 0
  rabbit_up
  matrix conns --port "$AMQP_PORT" -a "/queue/mxe-$run" --conns "$CONNS" --rate "$CONN_RATE" \
      --seconds "$CONN_SECONDS" --broker-pid "$BEAM_PID" --label "e rabbitmq $CONNS connections"
  rabbit_down
}

row_f() {
  local n kind replicas=() cpu0 rcpu0 i
  for n in $REPLICAS; do
    for kind in queue shared; do
      shoal_up "$n"
      replicas=(); for i in "${!APORTS[@]}"; do replicas+=(--replica "127.0.0.1:${APORTS[i]}"); done
      rcpu0=$(proc_cpu_s "$REDIS_PID")
      local pids=(); for i in "${BPIDS[@]}"; do pids+=(--broker-pid "$i"); done
      local extra=(); [[ $kind == queue ]] && extra=(--queue)
      timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/shared.py" "${replicas[@]}" \
          --consumers 6 --count "$NF" --timeout "$RUN_TIMEOUT" "${pids[@]}" "${extra[@]}" \
          --label "f shoal $kind on $n replicas" --json "$J" \
        || echo "(f $kind on $n replicas: incomplete or failed)"
      echo "  redis: $(awk -v a="$rcpu0" -v b="$(proc_cpu_s "$REDIS_PID")" -v n="$NF" \
          'BEGIN { printf "%.1f", 1e6 * (b - a) / n }') µs/msg"
      redis_stats "f shoal redis $kind $n"
      shoal_down
    done
  done
}

# shellcheck source=bench/redis_cluster.sh
. "$HERE/redis_cluster.sh"

sharded() {  # sharded SHARDS ROUND PART MESSAGES SPREAD COMMAND...: run COMMAND (which appends its
  # result to J), sampling every node of the cluster before and after; one row g record in J
  local shards=$1 round=$2 part=$3 n=$4 spread=$5 before skip stats
  shift 5
  touch "$J"
  skip=$(wc -l < "$J")
  stats=$OUT/commandstats-g-$shards-$round-${part//[^a-z0-9@]/_}
  cluster_commandstats > "$stats.before"
  before=$(cluster_sample)
  "$@" || echo "(g $part on $shards shards: incomplete or failed)"
  cluster_commandstats > "$stats.after"
  "$PY" "$HERE/shards.py" report --json "$J" --skip "$skip" --label "g shoal $part, $shards shards" \
      --part "$part" --shards "$shards" --round "$round" --messages "$n" --spread "$spread" \
      --before "$before" --after "$(cluster_sample)" || echo "(g $part: no record)"
}

G_STARTS=0
g_up() {  # g_up SHARDS BROKERS: the cluster and that many brokers on it; sets APORTS, BPIDS
  local i aport hport
  # a fresh directory each time: a node finding an old nodes.conf would rejoin the old cluster
  cluster_up "$1" "$(mktemp -d "$WORK/cluster-$1.XXXXXX")" || return 1
  APORTS=(); BPIDS=(); SHOAL_PIDS=()
  for ((i = 1; i <= $2; i++)); do
    read -r aport hport < <(free_ports 2)
    start_broker "$aport" "$hport" "$CLUSTER_URL" "matrix-g-$i" \
        "$OUT/broker-g-$1-shards-$((++G_STARTS))-$i.log" \
      || return 1
    APORTS+=("$aport"); BPIDS+=("$BROKER_PID"); SHOAL_PIDS+=("$BROKER_PID")
  done
}
g_down() { shoal_down; cluster_down; }  # brokers first, then their Redis

row_g() {
  local round s n kind run i spread prefix
  for ((round = 1; round <= G_ROUNDS; round++)); do
    for s in $SHARDS; do
      echo "--- row g round $round: $s shards ($(date -Is), load $(cut -d' ' -f1 /proc/loadavg))"
      run=$RANDOM$RANDOM
      g_up "$s" 1 || { echo "(g: $s shards did not start)"; g_down; continue; }
      # the first saturation run creates the queues; the second and the paced run reuse them,
      # so their per-message figures are the steady state's, not the queues' creation
      prefix=mxg$run; spread=$QUEUES
      ((s > 0)) && spread=$("$PY" "$HERE/slots.py" spread "$prefix" "$QUEUES" "$s")
      for kind in new warm; do
        sharded "$s" "$round" "a ${QUEUES} queues saturation, $kind queues" "$NA" "$spread" \
          load "g shoal $s shards a saturation $kind" "${APORTS[0]}" "${BPIDS[0]}" -a "$prefix" \
              --addresses "$QUEUES" -n "$NA" --max-backlog "$((10 * QUEUES))"
      done
      sharded "$s" "$round" "a ${QUEUES} queues @${RATE_A}/s" "$NLAT_A" "$spread" \
        load "g shoal $s shards a @${RATE_A}/s" "${APORTS[0]}" "${BPIDS[0]}" -a "$prefix" \
            --addresses "$QUEUES" -n "$NLAT_A" --rate "$RATE_A" --max-backlog 1000
      g_down
      for n in $G_REPLICAS; do
        for kind in queue shared; do
          g_up "$s" "$n" || { echo "(g: $s shards, $n brokers did not start)"; g_down; continue; }
          local replicas=() pids=() extra=()
          for i in "${!APORTS[@]}"; do replicas+=(--replica "127.0.0.1:${APORTS[i]}"); done
          for i in "${BPIDS[@]}"; do pids+=(--broker-pid "$i"); done
          [[ $kind == queue ]] && extra=(--queue)
          sharded "$s" "$round" "f $kind, consumers on $n replicas" "$NF" "" \
            timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/shared.py" "${replicas[@]}" \
                --consumers 6 --count "$NF" --timeout "$RUN_TIMEOUT" "${pids[@]}" "${extra[@]}" \
                --label "g shoal $s shards f $kind on $n replicas" --json "$J"
          g_down
        done
      done
    done
  done
  echo
  echo "row g: medians over $G_ROUNDS round(s), $(nproc) cores"
  "$PY" "$HERE/shards.py" table "$J" | tee "$OUT/row-g.md"
}

"row_$ROW"
