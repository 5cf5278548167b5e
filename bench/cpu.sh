#!/usr/bin/env bash
# bench/cpu.sh - A/B broker CPU per message: the load-insensitive figure for comparing builds on a
# shared machine. For each source tree given (a checkout's broker/ directory, put first on
# PYTHONPATH), start one private redis-server and one Shoal broker, then run the same bench/load.py
# row against each tree in turn (A B A B ...), REPS times, and print per tree the median broker
# CPU µs per message (utime+stime from /proc/PID/stat over the run), Redis CPU µs per message,
# msg/s, Redis pipelines per message from the broker's /metrics, and the load's p50 and p99
# latency (the latency row: ROW="--rate 1000" N=5000).
#
# usage: bench/cpu.sh SRC_A [SRC_B ...]        e.g. bench/cpu.sh /tmp/base/broker broker
# A tree may name the interpreter its broker runs on, SRC@PYTHON (default: $BROKER_PY, see
# lib.sh), e.g. bench/cpu.sh broker@.venv/bin/python broker@.venv-bench/bin/python.
#
# Environment: N (messages per run, 30000), REPS (3), ROW (extra bench/load.py options; default
# 1 -> 1 at-least-once closed loop: "--max-backlog 1000"), ENV (extra broker environment,
# e.g. "SHOAL_DEFAULT_ADDRESS_KIND=topic"), REDIS_ARGS (redis-server persistence options; default
# "--appendonly no"; the durable row: ENV=SHOAL_DURABILITY=fsync ROW="--max-backlog 1000 --durable"
# REDIS_ARGS="--appendonly yes --appendfsync always"), PY, RUN_TIMEOUT (120).
# Loopback only; every process started is stopped by PID on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${N:-30000}; REPS=${REPS:-3}; ROW=${ROW:---max-backlog 1000}; ENV=${ENV:-}
REDIS_ARGS=${REDIS_ARGS:---appendonly no}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
(($# >= 1)) || { echo "usage: $0 SRC_A [SRC_B ...]" >&2; exit 2; }

WORK=$(mktemp -d /tmp/shoal-cpu.XXXXXX)
stop_on_exit

metric() {  # sum of a Prometheus counter from the broker's /metrics
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^"m { s += $2 } END { print s + 0 }'
}

declare -a SRC RPID BPID APORT HPORT
i=0
for arg in "$@"; do
  src=$(cd "${arg%%@*}" && pwd)
  broker_py=$BROKER_PY; [[ $arg == *@* ]] && broker_py=${arg#*@}
  build_wire "$src" "$broker_py"
  read -r rport aport hport < <(free_ports 3)
  mkdir -p "$WORK/$i"
  # shellcheck disable=SC2086
  redis-server --bind 127.0.0.1 --port "$rport" --save '' $REDIS_ARGS --dir "$WORK/$i" \
      --logfile "$WORK/$i/redis.log" --daemonize no > /dev/null 2>&1 &
  RPID[i]=$!; STARTED_PIDS+=("${RPID[i]}")
  for ((t = 0; t < 100; t++)); do
    redis-cli -p "$rport" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  # shellcheck disable=SC2086
  env PYTHONPATH="$src" SHOAL_LOG_LEVEL=WARNING $ENV "$broker_py" -m shoal_broker \
      --listen "127.0.0.1:$aport" --http "127.0.0.1:$hport" \
      --redis-url "redis://127.0.0.1:$rport/0" --replica-id "cpu$i" > "$WORK/$i/broker.log" 2>&1 &
  BPID[i]=$!; STARTED_PIDS+=("${BPID[i]}")
  for ((t = 0; t < 300; t++)); do
    curl -sf "http://127.0.0.1:$hport/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
  SRC[i]="$src on $broker_py"; APORT[i]=$aport; HPORT[i]=$hport
  echo "tree $i: $src on $broker_py (broker pid ${BPID[i]}, redis pid ${RPID[i]})"
  i=$((i + 1))
done
echo "machine: nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg) N=$N REPS=$REPS ROW=$ROW ENV=$ENV"

RESULTS=$WORK/results.txt
for ((rep = 0; rep <= REPS; rep++)); do  # rep 0 warms every broker up and is not counted
  for ((j = 0; j < ${#SRC[@]}; j++)); do
    b0=$(proc_cpu_s "${BPID[j]}"); r0=$(proc_cpu_s "${RPID[j]}")
    p0=$(metric "${HPORT[j]}" shoal_redis_pipeline_seconds_count)
    n=$N; ((rep == 0)) && n=5000
    # shellcheck disable=SC2086
    out=$(timeout -k 10 $((RUN_TIMEOUT + 60)) "$PY" "$HERE/load.py" run \
          --port "${APORT[j]}" --timeout "$RUN_TIMEOUT" -a "cpu-$rep-$j" -n "$n" --size 1024 \
          --json "$WORK/load.jsonl" $ROW 2>&1) \
      || { echo "$out" >&2; echo "tree $j rep $rep failed" >&2; exit 1; }
    b1=$(proc_cpu_s "${BPID[j]}"); r1=$(proc_cpu_s "${RPID[j]}")
    p1=$(metric "${HPORT[j]}" shoal_redis_pipeline_seconds_count)
    rate=$(load_field "$WORK/load.jsonl" msgs_per_s)
    p50=$(load_field "$WORK/load.jsonl" p50_ms); p99=$(load_field "$WORK/load.jsonl" p99_ms)
    ((rep == 0)) && continue
    awk -v j="$j" -v n="$n" -v b="$(echo "$b1 - $b0" | bc)" -v r="$(echo "$r1 - $r0" | bc)" \
        -v p="$((${p1%.*} - ${p0%.*}))" -v rate="${rate:-0}" -v p50="$p50" -v p99="$p99" \
        'BEGIN { printf "%d %.1f %.1f %.0f %.3f %.3f %.3f\n", j, 1e6*b/n, 1e6*r/n, rate, p/n, p50, p99 }' \
        | tee -a "$RESULTS"
  done
done

echo
echo "| tree | broker µs/msg | Redis µs/msg | msg/s | pipelines/msg | p50 ms | p99 ms | source |"
echo "|---|---|---|---|---|---|---|---|"
for ((j = 0; j < ${#SRC[@]}; j++)); do
  "$PY" -c '
import statistics, sys
j, src, path = sys.argv[1:4]
rows = [line.split() for line in open(path) if line.split()[0] == j]
med = [statistics.median(float(r[c]) for r in rows) for c in range(1, 7)]
print(f"| {j} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.0f} | {med[3]:.3f} | {med[4]:.3f} "
      f"| {med[5]:.3f} | {src} |")
' "$j" "${SRC[j]}" "$RESULTS"
done
echo "per rep (tree broker-us redis-us msg/s pipelines/msg p50-ms p99-ms):"; cat "$RESULTS"
echo "machine after: loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
