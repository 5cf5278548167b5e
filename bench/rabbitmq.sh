#!/usr/bin/env bash
# bench/rabbitmq.sh - the peer for the side-by-side comparison: a private RabbitMQ node, the same
# rows as bench/run.sh through bench/load.py, then the node stopped. RabbitMQ is Debian's
# rabbitmq-server package (3.10) with its rabbitmq_amqp1_0 plugin; when missing it is installed
# with apt (see ensure_rabbitmq below: the package's own service is kept from starting).
#
# usage: bench/rabbitmq.sh [OUTDIR]      (bench/peers.sh runs it interleaved with run.sh)
#
# The node is private: its state, logs, cookie and plugin list live in a fresh temporary
# directory, it listens on 127.0.0.1 only, on free ports (AMQP, Erlang distribution and a
# private epmd), and every process it starts (the server script, beam, epmd) is stopped by PID
# on exit. Environment as for run.sh: N, NFAN, NLAT, RATE, REPS, WARMUP, BACKLOG, SIZE,
# RUN_TIMEOUT, PY, QUICK; ROWS picks rows among "i ii iii v iv d" (RabbitMQ has no JMS shared
# subscriptions, so no "s"). Addresses follow the plugin's scheme: /queue/NAME (a queue),
# /topic/KEY (amq.topic, one queue per subscriber); the durable row uses a durable queue and
# persistent messages.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
row_defaults
ROWS=" ${ROWS:-i ii iii v iv d} "
OUT=${1:-/tmp/shoal-bench/rabbitmq-$(date +%Y%m%d-%H%M%S)}
RMQ_SBIN=/usr/lib/rabbitmq/bin

ensure_rabbitmq() {  # apt-get install rabbitmq-server when missing, without starting its service
  [[ -x $RMQ_SBIN/rabbitmq-server ]] && return 0
  local sudo="" guard=/usr/sbin/policy-rc.d made_guard=0
  [[ $(id -u) == 0 ]] || sudo=sudo
  if [[ ! -e $guard ]]; then  # policy-rc.d exiting 101 keeps apt from starting services
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$guard" > /dev/null
    $sudo chmod +x "$guard"; made_guard=1
  fi
  echo "installing Debian's rabbitmq-server (its service is not started)"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
      --no-install-recommends rabbitmq-server > /dev/null; } || { ((made_guard)) && $sudo rm -f "$guard"
                                                                  return 1; }
  ((made_guard)) && $sudo rm -f "$guard"
  return 0
}
ensure_rabbitmq
"$PY" -c 'import cproton_ffi' 2>/dev/null || { echo "$PY lacks python-qpid-proton" >&2; exit 2; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/shoal-rabbitmq.XXXXXX)
CLEANUP_MESSAGE="RabbitMQ stopped; results in $OUT"
read -r AMQP_PORT DIST_PORT EPMD_PORT < <(free_ports 3)
NODE=shoal-bench-$$@localhost

rabbit_env() {  # everything the node and rabbitmqctl read, pointed into WORK
  export HOME=$WORK RABBITMQ_BASE=$WORK RABBITMQ_CONF_ENV_FILE=$WORK/rabbitmq-env.conf
  export RABBITMQ_CONFIG_FILE=$WORK/rabbitmq RABBITMQ_ADVANCED_CONFIG_FILE=$WORK/advanced.config
  export RABBITMQ_MNESIA_BASE=$WORK/mnesia RABBITMQ_LOG_BASE=$WORK/log
  export RABBITMQ_PID_FILE=$WORK/beam.pid RABBITMQ_ENABLED_PLUGINS_FILE=$WORK/enabled_plugins
  export RABBITMQ_NODENAME=$NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$AMQP_PORT RABBITMQ_DIST_PORT=$DIST_PORT
  export ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

stop_rabbitmq() {  # ask the node to stop, then add its epmd to what stop_on_exit stops by PID
  rabbit_env
  [[ -n ${BEAM_PID:-} ]] && timeout 60 "$RMQ_SBIN/rabbitmqctl" -n "$NODE" stop > /dev/null 2>&1
  local epmd
  epmd=$(ss -ltnpH "sport = :$EPMD_PORT" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2 || true)
  [[ -n $epmd ]] && STARTED_PIDS+=("$epmd")
  return 0
}
_rabbit_cleanup() {
  local rc=$?
  set +e
  stop_rabbitmq
  (exit "$rc")
  _cleanup
}

start_rabbitmq() {  # sets BEAM_PID once the node answers and its AMQP port listens
  rabbit_env
  : > "$WORK/rabbitmq-env.conf"
  echo 'log.file.level = warning' > "$WORK/rabbitmq.conf"
  echo '[].' > "$WORK/advanced.config"
  "$RMQ_SBIN/rabbitmq-plugins" enable --offline rabbitmq_amqp1_0 > "$WORK/plugins.out"
  setsid "$RMQ_SBIN/rabbitmq-server" > "$OUT/rabbitmq-server.out" 2>&1 &
  STARTED_PIDS+=("$!")
  local server=$! deadline=$((SECONDS + 120))
  until timeout 60 "$RMQ_SBIN/rabbitmqctl" -n "$NODE" await_startup --timeout 50 > /dev/null 2>&1; do
    if ((SECONDS > deadline)) || ! kill -0 "$server" 2>/dev/null; then
      echo "RabbitMQ did not start; see $OUT/rabbitmq-server.out" >&2; exit 1
    fi
    sleep 2
  done
  BEAM_PID=$(cat "$RABBITMQ_PID_FILE")
  STARTED_PIDS+=("$BEAM_PID")
  for ((t = 0; t < 100; t++)); do
    ss -ltnH "sport = :$AMQP_PORT" | grep -q . && break; sleep 0.1; done
  echo "RabbitMQ $(dpkg-query -W -f='${Version}' rabbitmq-server) up: beam pid $BEAM_PID," \
       "amqp 127.0.0.1:$AMQP_PORT"
}

trap _rabbit_cleanup EXIT
trap 'exit 130' INT TERM
start_rabbitmq

{
  echo "rabbitmq: $(date -Is) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "N=$N NFAN=$NFAN NLAT=$NLAT RATE=$RATE REPS=$REPS WARMUP=$WARMUP BACKLOG=$BACKLOG SIZE=$SIZE"
} | tee "$OUT/machine.txt"

J="$OUT/results.jsonl"
FAILED=()
bench() {  # label, then bench/load.py run options
  local label=$1
  shift
  echo "--- $label"
  timeout -k 10 $(((REPS + 1) * (RUN_TIMEOUT + 30) + 60)) "$PY" "$HERE/load.py" run \
      --port "$AMQP_PORT" --timeout "$RUN_TIMEOUT" --reps "$REPS" --size "$SIZE" \
      --broker-pid "$BEAM_PID" --label "rabbitmq $label" --json "$J" "$@" 2>&1 \
    | tee -a "$OUT/log.txt" || { echo "($label: incomplete or failed)"; FAILED+=("$label"); }
}
row() { [[ $ROWS == *" $1 "* ]]; }

Q='/queue/bench-{run}'
row i && bench "i queue 1p1c at-least-once" -a "$Q" -n "$N" --max-backlog "$BACKLOG" \
  --warmup "$WARMUP"
row ii && bench "ii queue 1p1c presettled" -a "$Q" -n "$N" --max-backlog "$BACKLOG" --presettled
row iii && bench "iii queue 1p4c competing" -a "$Q" -n "$N" --max-backlog "$BACKLOG" -k 4
row v && bench "v latency @${RATE}/s" -a "$Q" -n "$NLAT" --rate "$RATE" --max-backlog "$BACKLOG"
row iv && bench "iv topic fan-out 1p4s" -a '/topic/bench.{run}' -n "$NFAN" \
  --max-backlog "$BACKLOG" -k 4 --fanout
row d && bench "i-durable queue 1p1c at-least-once" -a '/queue/bench-d-{run}' -n "$N" \
  --max-backlog "$BACKLOG" --durable

touch "$J"
"$PY" "$HERE/load.py" table "$J" | tee "$OUT/table.md"
if ((${#FAILED[@]})); then
  echo "incomplete or failed rows: ${FAILED[*]}" >&2
  exit 1
fi
