# bench/rabbit_node.sh - sourced after bench/lib.sh: a private RabbitMQ node for the
# side-by-side rows (bench/rabbitmq.sh, bench/matrix.sh). Debian's rabbitmq-server package (3.10)
# with its rabbitmq_amqp1_0 plugin, installed with apt when missing (its service kept from
# starting). The caller sets OUT and WORK and the free loopback ports AMQP_PORT DIST_PORT
# EPMD_PORT and NODE; start_rabbitmq sets BEAM_PID; every process is stopped by PID on exit
# (trap _rabbit_cleanup EXIT).
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

