# bench/lib.sh - sourced by the bench scripts: what each of them needs the same way.
# Every process they start is stopped by its PID: append each PID to STARTED_PIDS. After WORK is
# set, `stop_on_exit` stops them, removes WORK and prints CLEANUP_MESSAGE (if set) on any exit.
# It also sets HERE (bench/), ROOT (the checkout) and PY (overridable), and reads the results of
# bench/load.py (load_field).
STARTED_PIDS=()
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}

row_defaults() {  # the suite's sizes (run.sh, rabbitmq.sh): the environment's, else QUICK=1's
  # small ones (a check that everything works), else the full ones
  if [[ ${QUICK:-0} == 1 ]]; then
    N=${N:-3000}; NFAN=${NFAN:-1000}; NLAT=${NLAT:-1000}; REPS=${REPS:-1}; WARMUP=${WARMUP:-500}
  fi
  N=${N:-50000}; NFAN=${NFAN:-20000}; NLAT=${NLAT:-10000}; RATE=${RATE:-1000}
  REPS=${REPS:-3}; WARMUP=${WARMUP:-5000}; BACKLOG=${BACKLOG:-1000}; SIZE=${SIZE:-1024}
  RUN_TIMEOUT=${RUN_TIMEOUT:-120}
}

load_field() {  # load_field JSONL KEY: the median KEY of the last row bench/load.py appended
  "$PY" -c 'import json, sys; v = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(json.dumps(v["median"][sys.argv[2]]))' "$1" "$2"
}

# The broker runs on BROKER_PY; the load generator and the other clients stay on PY, alike for
# every broker measured. By default BROKER_PY is .venv-bench/bin/python, a venv (made here on
# first use) on BENCH_PYTHON, an interpreter built the way the shipped image's is: the official
# python image (docker/broker.Dockerfile) and Debian's python3.11 are built with PGO and LTO.
# A plain source build of python3 (pyenv's default: neither) costs the broker 9-32 % more CPU
# per message (docs/performance.md#interpreter).
bench_python() {  # prints the broker's interpreter, making .venv-bench when it is missing
  local base=${BENCH_PYTHON:-/usr/bin/python3.11} venv=$ROOT/.venv-bench
  if [[ ! -x $base ]]; then
    echo "note: $base is missing, so the broker runs on $PY (set BENCH_PYTHON)" >&2
    echo "$PY"; return 0
  fi
  if [[ ! -f $venv/.installed || $ROOT/pyproject.toml -nt $venv/.installed ]]; then
    { "$base" -m venv "$venv" && "$venv/bin/python" -m pip install -q --upgrade pip \
        && "$venv/bin/python" -m pip install -q -e "$ROOT[broker,tracing]" && touch "$venv/.installed"; } \
        >&2 || { echo "could not make $venv on $base (python3.11-venv and python3.11-dev" \
                      "are needed)" >&2; return 1; }
  fi
  echo "$venv/bin/python"
}
BROKER_PY=${BROKER_PY:-$(bench_python)}

stop_started() {  # TERM each started process, KILL what is still there after 15 s
  local pid i
  for pid in "${STARTED_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  done
}

_cleanup() {
  local rc=$?
  set +e
  stop_started
  rm -rf "$WORK"
  [[ -n ${CLEANUP_MESSAGE:-} ]] && echo "$CLEANUP_MESSAGE"
  exit "$rc"
}

stop_on_exit() {
  trap _cleanup EXIT
  trap 'exit 130' INT TERM
}

free_ports() {  # N distinct free loopback ports (needs PY)
  "$PY" -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))' "$1"
}

proc_cpu_s() {  # CPU seconds (user + system) a process has used so far
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"
}

cpu_ticks() {  # the machine's CPU ticks so far (/proc/stat): busy, steal, total
  awk '/^cpu / { busy = $2 + $3 + $4 + $7 + $8; print busy, $9, busy + $5 + $6 + $9; exit }' \
      /proc/stat
}

machine_share() {  # machine_share BEFORE AFTER (two cpu_ticks outputs): the busy and the steal
  # percentages of the machine's time in between. Steal is time the hypervisor gave the vCPUs
  # to someone else: on a VM the latency row's p99 follows it (docs/performance.md#steal)
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x); split(b, y); t = y[3] - x[3]; if (t <= 0) t = 1
    printf "%.1f %.1f\n", 100 * (y[1] - x[1]) / t, 100 * (y[2] - x[2]) / t }'
}

build_wire() {  # build_wire BROKER_SOURCE_ROOT [PYTHON]: compile a source tree's C (the hot path,
  # and the plain extensions, routing/_entry.c and those beside it, where the tree has them) if it
  # is missing or older than its source (a tree copied with `git archive` has none)
  local src=$1 py=${2:-$BROKER_PY} so fresh=0 c
  [[ -f $src/shoal_broker/amqp/_wire.c ]] || return 0
  for so in "$src"/shoal_broker/amqp/_wire.*.so; do
    [[ -f $so && $so -nt $src/shoal_broker/amqp/_wire.c ]] || continue
    [[ ! -f $src/shoal_broker/amqp/outcome_codes.py || $so -nt $src/shoal_broker/amqp/outcome_codes.py ]] \
        && fresh=1
  done
  for c in routing/_entry.c routing/_entry_api.h store/_replies.c metrics/_latency.c; do
    [[ $fresh == 1 && -f $src/shoal_broker/$c ]] || continue
    fresh=0
    for so in "$src"/shoal_broker/"${c%%/*}"/_*.so; do
      [[ $so == */_wire.* || ! -f $so || ! $so -nt $src/shoal_broker/$c ]] || fresh=1
    done
  done
  [[ $fresh == 1 ]] && return 0
  "$py" "$ROOT/scripts/build_wire.py" "$src" > /dev/null
}

start_redis() {  # start_redis PORT DIR [redis-server options]: sets REDIS_PID once it answers PING
  local port=$1 dir=$2 t
  shift 2
  redis-server --bind 127.0.0.1 --port "$port" --save '' "$@" --dir "$dir" \
      --logfile "$dir/redis.log" --daemonize no > /dev/null 2>&1 &
  REDIS_PID=$!; STARTED_PIDS+=("$REDIS_PID")
  for ((t = 0; t < 100; t++)); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done
  echo "redis-server on port $port did not start" >&2; return 1
}

start_broker() {  # start_broker AMQP_PORT HTTP_PORT REDIS_PORT REPLICA LOG: sets BROKER_PID once
  # /readyz answers (needs BROKER_PY; extra broker environment comes from the caller's exports).
  # REDIS_PORT may be a whole store URL instead (redis+cluster://...)
  local t url=$3
  [[ $url == *://* ]] || url=redis://127.0.0.1:$3/0
  SHOAL_LOG_LEVEL=${SHOAL_LOG_LEVEL:-WARNING} "$BROKER_PY" -m shoal_broker --listen "127.0.0.1:$1" \
      --http "127.0.0.1:$2" --redis-url "$url" --replica-id "$4" > "$5" 2>&1 &
  BROKER_PID=$!; STARTED_PIDS+=("$BROKER_PID")
  for ((t = 0; t < 300; t++)); do
    curl -sf "http://127.0.0.1:$2/readyz" > /dev/null 2>&1 && return 0; sleep 0.1; done
  echo "broker on port $1 did not become ready" >&2; return 1
}

start_tree() {  # start_tree INDEX SRC REPLICA: a redis-server (no persistence) and a broker on a
  # source tree (a checkout's broker/ directory SRC, first on PYTHONPATH) in WORK/INDEX, on free
  # ports: sets RPORT APORT HPORT REDIS_PID BROKER_PID
  local src
  src=$(cd "$2" && pwd)
  build_wire "$src"
  read -r RPORT APORT HPORT < <(free_ports 3)
  mkdir -p "$WORK/$1"
  start_redis "$RPORT" "$WORK/$1" --appendonly no
  PYTHONPATH="$src" start_broker "$APORT" "$HPORT" "$RPORT" "$3" "$WORK/$1/broker.log"
}

start_stack() {  # start_stack NAME: WORK, stop_on_exit, then a redis-server (no persistence) and
  # one broker (replica id NAME) on free ports: sets RPORT APORT HPORT REDIS_PID BROKER_PID
  WORK=$(mktemp -d "/tmp/shoal-$1.XXXXXX")
  stop_on_exit
  read -r RPORT APORT HPORT < <(free_ports 3)
  start_redis "$RPORT" "$WORK" --appendonly no
  start_broker "$APORT" "$HPORT" "$RPORT" "$1" "$WORK/broker.log"
}

instructions_against() {  # instructions_against BASE LABEL: each ';'-separated row of ROWS in
  # broker instructions per message (instructions.sh), tree 0 the broker of commit BASE (a `git
  # archive` of it in WORK/base: nothing outside the repository) and tree 1 this checkout's;
  # LABEL says what the two trees are in each row's heading. Needs WORK.
  local row rows
  mkdir -p "$WORK/base"
  git -C "$ROOT" archive "$1" broker | tar -x -C "$WORK/base"
  echo "base: $(git -C "$ROOT" log -1 --format='%h %s' "$1")"
  echo "this: $(git -C "$ROOT" log -1 --format='%h %s') $(git -C "$ROOT" status --porcelain \
       | grep -q . && echo '(with changes)')"
  IFS=';' read -r -a rows <<< "$ROWS"
  for row in "${rows[@]}"; do
    echo
    echo "### ROW=\"$row\" ($2)"
    ROW="$row" "$HERE/instructions.sh" "$WORK/base/broker" "$ROOT/broker"
  done
}
