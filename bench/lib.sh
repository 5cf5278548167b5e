# bench/lib.sh - sourced by the bench scripts: what each of them needs the same way.
# Every process they start is stopped by its PID: append each PID to STARTED_PIDS. After WORK is
# set, `stop_on_exit` stops them, removes WORK and prints CLEANUP_MESSAGE (if set) on any exit.
STARTED_PIDS=()

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
