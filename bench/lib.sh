# bench/lib.sh - sourced by the bench scripts: every process they start is stopped by its PID.
# Append each started PID to STARTED_PIDS and call stop_started from the script's EXIT trap.
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
