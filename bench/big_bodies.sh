#!/usr/bin/env bash
# bench/big_bodies.sh - big messages with and without their bodies beside the Lua scripts
# (store/bodies.py, docs/performance.md#big-bodies): two stacks (a redis-server and a broker
# each), one with SHOAL_BIG_MESSAGE_BYTES=0 (every body through the scripts) and one with the
# default, and a private RabbitMQ node (bench/rabbit_node.sh; SKIP_RABBITMQ=1 leaves it out),
# measured in turn, ROUNDS times, so that a machine shared with other work weighs on each alike
# (all three stay up: the idle ones cost the measured one little). Each row: SIZES
# ("65536 1048576") bytes 1->1 at-least-once, N_BYTES (1 GiB) per row, 16 MiB in flight (as
# matrix.sh's row c, which moves 200 MiB); then Redis's CPU and per-command cost in each stack.
#
# usage: bench/big_bodies.sh [OUTDIR]      environment: ROUNDS (3), SIZES, N_BYTES, PY, BROKER_PY
# Every process started here is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
OUT=${1:-/tmp/shoal-bench/big-bodies-$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-3}; SIZES=${SIZES:-65536 1048576}; N_BYTES=${N_BYTES:-1073741824}
mkdir -p "$OUT"
J="$OUT/big_bodies.jsonl"
WORK=$(mktemp -d /tmp/shoal-big-bodies.XXXXXX)
read -r AMQP_PORT DIST_PORT EPMD_PORT < <(free_ports 3)
NODE=shoal-big-bodies-$$@localhost
# shellcheck source=bench/rabbit_node.sh
. "$HERE/rabbit_node.sh"
trap _rabbit_cleanup EXIT
trap 'exit 130' INT TERM

declare -A APORT RPORT BPID RPID
for mode in lua beside; do
  read -r RPORT[$mode] APORT[$mode] hport < <(free_ports 3)
  mkdir -p "$WORK/$mode"
  start_redis "${RPORT[$mode]}" "$WORK/$mode" --appendonly no
  RPID[$mode]=$REDIS_PID
  threshold=32768; [[ $mode == lua ]] && threshold=0
  SHOAL_BIG_MESSAGE_BYTES=$threshold start_broker "${APORT[$mode]}" "$hport" "${RPORT[$mode]}" \
      "big-$mode" "$OUT/broker-$mode.log"
  BPID[$mode]=$BROKER_PID
done
MODES="lua beside"
if [[ ${SKIP_RABBITMQ:-0} != 1 ]]; then  # after the brokers: rabbit_env moves HOME
  ensure_rabbitmq
  start_rabbitmq
  APORT[rabbitmq]=$AMQP_PORT; BPID[rabbitmq]=$BEAM_PID; MODES="$MODES rabbitmq"
fi

echo "big bodies: $(date -Is) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" \
     "shoal $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" | tee "$OUT/machine.txt"
for ((round = 1; round <= ROUNDS; round++)); do
  for size in $SIZES; do
    n=$((N_BYTES / size)); ((n > 20000)) && n=20000
    backlog=$((16 * 1048576 / size)); ((backlog < 4)) && backlog=4; ((backlog > 200)) && backlog=200
    for mode in $MODES; do
      address="bb-{run}"; [[ $mode == rabbitmq ]] && address="/queue/bb-{run}"
      timeout -k 10 660 "$PY" "$HERE/load.py" run --port "${APORT[$mode]}" --timeout 600 \
          --broker-pid "${BPID[$mode]}" --label "$mode $size B round $round" --json "$J" \
          -a "$address" -n "$n" --size "$size" --max-backlog "$backlog" | tail -1 \
        | sed "s/^/$mode $size B round $round: /" || echo "($mode $size: failed)"
    done
  done
done
for mode in lua beside; do
  echo "$mode redis CPU s: $(proc_cpu_s "${RPID[$mode]}")"
  redis-cli -p "${RPORT[$mode]}" info commandstats \
    | grep -E '^cmdstat_(eval|evalsha|exec|set|mget|unlink|xreadgroup|xack|xadd):' \
    | sed "s/^/$mode /"
done
