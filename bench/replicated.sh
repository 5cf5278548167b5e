#!/usr/bin/env bash
# bench/replicated.sh - A/B broker trees in `replicated` durability on a Redis primary with one
# replica: the 1 -> 1 at-least-once row (ROW) per tree, interleaved REPS times, the primary and
# its replica fresh for each run. What `WAIT 1` on more of the pipelines costs (a tree that waits
# on its fetch and ack pipelines too, docs/performance.md#durable-fetches) shows here, where
# bench/instructions.sh does not see it: the wait is time, not instructions. Each run's line also
# gives the WAIT commands the primary ran (INFO commandstats): a count the machine's noise spares.
#
# usage: bench/replicated.sh SRC_A [SRC_B ...]   (a tree's broker/ directory; SRC:VAR=v,VAR2=w
#        gives that tree broker environment of its own, as in bench/instructions.sh)
# Environment: N (20000), WARMUP (2000), REPS (3), ROW (bench/load.py options; default
# "--max-backlog 200"), PY, BROKER_PY. Loopback only; every process started is stopped by PID.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${N:-20000}; WARMUP=${WARMUP:-2000}; REPS=${REPS:-3}; ROW=${ROW:---max-backlog 200}
(($# >= 1)) || { echo "usage: $0 SRC_A [SRC_B ...]" >&2; exit 2; }

WORK=$(mktemp -d /tmp/shoal-replicated.XXXXXX)
stop_on_exit

echo "machine: nproc=$(nproc) N=$N WARMUP=$WARMUP REPS=$REPS ROW=$ROW"
for ((rep = 1; rep <= REPS; rep++)); do
  i=0
  for arg in "$@"; do
    src=${arg%%:*}; own=""
    [[ $arg == *:* ]] && own=${arg#*:} && own=${own//,/ }
    src=$(cd "$src" && pwd)
    build_wire "$src"
    dir=$WORK/$rep-$i
    mkdir -p "$dir/primary" "$dir/replica"
    read -r pport rport aport hport < <(free_ports 4)
    start_redis "$pport" "$dir/primary" --appendonly no
    primary=$REDIS_PID
    start_redis "$rport" "$dir/replica" --appendonly no --replicaof 127.0.0.1 "$pport"
    replica=$REDIS_PID
    for ((t = 0; t < 100; t++)); do
      redis-cli -p "$rport" INFO replication | grep -q 'master_link_status:up' && break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    env PYTHONPATH="$src" SHOAL_LOG_LEVEL=WARNING SHOAL_DURABILITY=replicated $own \
        "$BROKER_PY" -m shoal_broker --listen "127.0.0.1:$aport" --http "127.0.0.1:$hport" \
        --redis-url "redis://127.0.0.1:$pport/0" --replica-id "rep$i" > "$dir/broker.log" 2>&1 &
    bpid=$!; STARTED_PIDS+=("$bpid")
    for ((t = 0; t < 300; t++)); do
      curl -sf "http://127.0.0.1:$hport/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
    # shellcheck disable=SC2086
    timeout -k 10 900 "$PY" "$HERE/load.py" run --port "$aport" --timeout 300 -a "r-$rep-$i" \
        -n "$N" --warmup "$WARMUP" --size 1024 --broker-pid "$bpid" \
        --label "$i ${src}${own:+:${own// /,}}" --json "$WORK/results.jsonl" $ROW \
        > "$dir/load.out" 2>&1 || { cat "$dir/load.out" >&2; exit 1; }
    # the WAITs Redis ran (warm-up included): a count, which the noise of the machine spares
    waits=$(redis-cli -p "$pport" INFO commandstats | tr -d '\r' \
      | sed -n 's/^cmdstat_wait:calls=\([0-9]*\),.*/\1/p')
    echo "$(tail -1 "$dir/load.out"); ${waits:-0} WAITs for $((N + WARMUP)) messages"
    kill -TERM "$bpid"; wait "$bpid" || true
    kill -TERM "$replica" "$primary"; wait "$replica" "$primary" || true
    i=$((i + 1))
  done
done
echo
"$PY" "$HERE/load.py" table "$WORK/results.jsonl"
