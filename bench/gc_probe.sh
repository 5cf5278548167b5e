#!/usr/bin/env bash
# bench/gc_probe.sh - a BROKER_PY that runs the broker under bench/gc_probe.py (the collector's
# time by generation, written to $GC_PROBE_DIR when the broker exits). Example:
#   GC_PROBE_DIR=/tmp/gc BROKER_PY=$PWD/bench/gc_probe.sh SKIP_RABBITMQ=1 SUBS=1000 bench/matrix.sh b
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[[ ${1:-} == -m ]] && shift 2  # "-m shoal_broker", as lib.sh starts a broker
exec "${GC_PROBE_PY:-$HERE/../.venv-bench/bin/python}" "$HERE/gc_probe.py" "$@"
