"""
The broker under a timer of the cyclic garbage collector: every collection's time, by
generation, written as JSON to ``$GC_PROBE_DIR/gc-PID.json`` when the broker exits (count, total
and longest pause per generation, and the process's CPU time). Where the collector's share of
a row's CPU comes from (docs/performance.md, "Entries the collector does not track").

usage: run a row with ``BROKER_PY=bench/gc_probe.sh`` (which drops ``-m shoal_broker`` and runs
this file with the benchmark interpreter, ``GC_PROBE_PY``, default ``.venv-bench/bin/python``).
"""

import atexit
import gc
import json
import os
import runpy
import sys
import time
from typing import Any

_stats = {generation: {'count': 0, 'total_s': 0.0, 'longest_ms': 0.0} for generation in range(3)}
_started = [0.0]


def _timed(phase: str, info: dict[str, Any]) -> None:
    if phase == 'start':
        _started[0] = time.perf_counter()
        return
    took = time.perf_counter() - _started[0]
    stats = _stats[info['generation']]
    stats['count'] += 1
    stats['total_s'] += took
    stats['longest_ms'] = max(stats['longest_ms'], took * 1000)


def _write() -> None:
    out = os.environ.get('GC_PROBE_DIR', '/tmp')
    with open(os.path.join(out, f'gc-{os.getpid()}.json'), 'w') as f:
        json.dump({'cpu_s': round(time.process_time(), 3), 'generations': _stats}, f)
        f.write('\n')


if __name__ == '__main__':
    gc.callbacks.append(_timed)
    atexit.register(_write)
    sys.argv = ['shoal_broker', *sys.argv[1:]]
    runpy.run_module('shoal_broker', run_name='__main__', alter_sys=True)
