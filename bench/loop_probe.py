"""
bench/loop_probe.py - the broker with probes on its event loop: where a steady state's time goes.

usage: BROKER_PY bench/loop_probe.py OUT.json BROKER_ARGS...     (the arguments of shoal-broker)

Runs the broker in this process, as ``shoal-broker`` would, with three probes that record only
between SIGUSR1 (start: every figure reset) and SIGUSR2 (stop: OUT.json written):

- loop lag: a task sleeping 1 ms notes how late each wake-up is (the percentiles of how long a
  ready callback waited behind others), on any loop; and the process's CPU time between two of
  its turns, which time descheduled on a shared machine does not inflate (the loop's longest
  stretches of work, give or take the lease thread's);
- slow callbacks (``PROBE_ASYNCIO=1``: the standard library's loop instead of uvloop, whose
  ``Handle._run`` is Python and can be timed): the count and total of callbacks by CPU time
  band, and the callbacks above 1 ms by what they ran (the task's coroutine or the callback);
- the cyclic garbage collector: collections by generation, their total and longest CPU time;
- cProfile (``PROBE_PROFILE=FILE``): the broker's functions over the window, CPU time (not wall:
  time descheduled on a shared machine is not charged), written to FILE (``python -m pstats``);
- loop calls (``PROBE_COUNT=1``, uvloop only): every ``call_soon``, ``call_later``, ``call_at``
  and ``create_task`` made through the loop's Python methods, by what made it, and every timer
  cancelled (what ``bench/trickle_count.sh`` divides by the messages). ``PROBE_LAG=0`` leaves out
  the 1 ms sampler, whose own wake-ups would be counted among the broker's.

Why its own: the broker's ``shoal_event_loop_lag_seconds`` samples every 100 ms, too coarse for
a p99 of a few ms, and a profile of the whole process includes start-up and the throughput rows
before a latency row. The probe runs at most PROBE_SECONDS (3600) and ends with the broker.
"""

import asyncio
import cProfile
import gc
import json
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from typing import Any

from shoal_broker import app, cli

LAG_TICK = 0.001
BANDS_MS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0)
MAX_SECONDS = float(os.environ.get('PROBE_SECONDS', '3600'))


class Probe:
    def __init__(self, out: str) -> None:
        self.out = out
        self.on = False
        self.lags: list[float] = []
        self.cpu_lags: list[float] = []
        self.bands: Counter[str] = Counter()
        self.band_ms: defaultdict[str, float] = defaultdict(float)
        self.slow: Counter[str] = Counter()
        self.slow_ms: defaultdict[str, float] = defaultdict(float)
        self.profile: cProfile.Profile | None = None
        self.started = 0.0
        self.cpu0 = 0.0
        self.gc: Counter[str] = Counter()
        self.gc_ms: defaultdict[str, float] = defaultdict(float)
        self.gc_max_ms = 0.0
        self._gc_t0 = 0.0
        self.gc_collected = 0
        self.young: Counter[str] = Counter()
        self.loop_calls: Counter[str] = Counter()
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == 'start':  # CPU time: a collection descheduled midway is not charged for it
            if self.on and info['generation'] == 0 and not self.young:  # what the first one scans
                self.young = Counter(type(o).__qualname__ for o in gc.get_objects(0))
            self._gc_t0 = time.process_time()
        elif self.on:
            self.gc_collected += info['collected']
            ms = 1000 * (time.process_time() - self._gc_t0)
            gen = f'gen{info["generation"]}'
            self.gc[gen] += 1
            self.gc_ms[gen] += ms
            self.gc_max_ms = max(self.gc_max_ms, ms)

    def start(self) -> None:
        self.lags.clear()
        self.cpu_lags.clear()
        for c in (self.bands, self.band_ms, self.slow, self.slow_ms, self.gc, self.gc_ms):
            c.clear()
        self.gc_max_ms = 0.0
        self.gc_collected = 0
        self.young.clear()
        self.loop_calls.clear()
        self.started, self.cpu0 = time.perf_counter(), time.process_time()
        if os.environ.get('PROBE_PROFILE'):
            self.profile = cProfile.Profile(time.process_time)  # CPU, not time descheduled
            self.profile.enable()
        self.on = True

    def stop(self) -> None:
        if not self.on:
            return
        self.on = False
        wall, cpu = time.perf_counter() - self.started, time.process_time() - self.cpu0
        if self.profile is not None:
            self.profile.disable()
            self.profile.dump_stats(os.environ['PROBE_PROFILE'])
        lags, cpu_lags = sorted(self.lags), sorted(self.cpu_lags)
        garbage = _cyclic_garbage()

        def pct(p: float, lags: list[float] = lags) -> float | None:
            return (
                round(1000 * lags[min(len(lags) - 1, int(p / 100 * len(lags)))], 3)
                if lags
                else None
            )

        report: dict[str, Any] = {
            'wall_s': round(wall, 3),
            'cpu_s': round(cpu, 3),
            'lag_samples': len(lags),
            'lag_ms': {f'p{p}': pct(p) for p in (50, 90, 99, 99.9, 100)},
            'cpu_between_turns_ms': {f'p{p}': pct(p, cpu_lags) for p in (50, 90, 99, 99.9, 100)},
            'lag_over_ms': {f'{t}': sum(1 for x in lags if x > t / 1000) for t in (1, 2, 5, 10)},
            'gc': {g: [n, round(self.gc_ms[g], 1)] for g, n in self.gc.items()},
            'gc_max_ms': round(self.gc_max_ms, 2),
            'gc_collected': self.gc_collected,
            'gc_young_by_type': dict(self.young.most_common(25)),
            'cyclic_garbage': garbage,
            'callbacks_by_band': dict(self.bands),
            'callback_ms_by_band': {k: round(v, 1) for k, v in self.band_ms.items()},
            'loop_calls': dict(self.loop_calls.most_common(60)),
            'slow_callbacks': [
                {'what': what, 'count': n, 'total_ms': round(self.slow_ms[what], 1)}
                for what, n in self.slow.most_common(40)
            ],
        }
        with open(self.out, 'w') as f:
            json.dump(report, f, indent=1)

    async def sample_lag(self) -> None:
        clock, cpu = time.perf_counter, time.process_time  # uvloop's loop.time() counts ms
        end = clock() + MAX_SECONDS
        while clock() < end:
            start, cpu0 = clock(), cpu()
            await asyncio.sleep(LAG_TICK)
            if self.on:
                self.lags.append(max(0.0, clock() - start - LAG_TICK))
                self.cpu_lags.append(cpu() - cpu0)

    def time_callbacks(self) -> None:
        """Wrap the standard loop's Handle._run: every callback timed, the slow ones named."""
        run = asyncio.events.Handle._run
        probe = self

        def timed(handle: asyncio.events.Handle) -> None:
            if not probe.on:
                run(handle)
                return
            t0 = time.process_time()  # CPU: a callback descheduled midway is not charged
            run(handle)
            ms = 1000 * (time.process_time() - t0)
            band = next((f'<{b}' for b in BANDS_MS if ms < b), f'>={BANDS_MS[-1]}')
            probe.bands[band] += 1
            probe.band_ms[band] += ms
            if ms >= 1.0:
                what = _name(handle)
                probe.slow[what] += 1
                probe.slow_ms[what] += ms

        asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]


def _cyclic_garbage() -> dict[str, Any]:
    """What the young generation holds that only the cyclic collector frees: by type, and the
    functions (closures) among it by name, which say where the cycles are made."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect(0)
        found = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    types = Counter(type(o).__qualname__ for o in found)
    functions = Counter(
        getattr(o, '__qualname__', '?') for o in found if type(o).__name__ in ('function', 'method')
    )
    frames = Counter(
        f'{o.f_code.co_qualname} {o.f_code.co_filename.rsplit("/", 2)[-1]}:{o.f_lineno}'
        for o in found
        if type(o).__name__ == 'frame'
    )
    coros = Counter(
        getattr(o, '__qualname__', '?') for o in found if type(o).__name__ == 'coroutine'
    )
    return {
        'objects': len(found),
        'by_type': dict(types.most_common(25)),
        'functions': dict(functions.most_common(25)),
        'frames': dict(frames.most_common(15)),
        'coroutines': dict(coros.most_common(15)),
    }


_COUNTING: list[Probe] = []
"""The probe whose ``loop_calls`` the counting loop adds to (``PROBE_COUNT=1``)."""


def _count(kind: str) -> None:
    probe = _COUNTING[0]
    if probe.on:
        f = sys._getframe(2)
        probe.loop_calls[
            f'{kind}: {f.f_code.co_filename.rsplit("/", 2)[-1]}:{f.f_code.co_name}'
        ] += 1


class _CountingTimer:
    """A timer handle that counts its cancellation (by who cancels)."""

    __slots__ = ('handle',)

    def __init__(self, handle: asyncio.TimerHandle) -> None:
        self.handle = handle

    def cancel(self) -> None:
        _count('timer cancelled')
        self.handle.cancel()

    def cancelled(self) -> bool:
        return self.handle.cancelled()

    def when(self) -> float:
        return self.handle.when()


def counting_loop(probe: Probe) -> asyncio.AbstractEventLoop:
    """A uvloop loop whose scheduling methods count their calls by caller while the probe is
    on. uvloop's own Cython calls bypass these methods; asyncio's C futures and tasks, and every
    Python caller, go through them."""
    import uvloop

    _COUNTING.append(probe)

    class CountingLoop(uvloop.Loop):  # type: ignore[misc]
        def call_soon(self, *args: Any, **kw: Any) -> Any:
            _count('call_soon')
            return super().call_soon(*args, **kw)

        def call_later(self, *args: Any, **kw: Any) -> Any:
            _count('call_later')
            return _CountingTimer(super().call_later(*args, **kw))

        def call_at(self, *args: Any, **kw: Any) -> Any:
            _count('call_at')
            return _CountingTimer(super().call_at(*args, **kw))

        def create_task(self, *args: Any, **kw: Any) -> Any:
            _count('create_task')
            return super().create_task(*args, **kw)

    loop: asyncio.AbstractEventLoop = CountingLoop()
    return loop


def _name(handle: asyncio.events.Handle) -> str:
    cb = handle._callback  # type: ignore[attr-defined]
    owner = getattr(cb, '__self__', None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        frame = getattr(coro, 'cr_frame', None)
        where = f'{frame.f_code.co_filename.rsplit("/", 2)[-1]}:{frame.f_lineno}' if frame else ''
        return f'task {owner.get_name()} {getattr(coro, "__qualname__", coro)!s} {where}'
    return getattr(cb, '__qualname__', repr(cb))


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    settings = cli.settings_from(argv)
    cli.configure_logging(settings)
    probe = Probe(out)

    async def serve() -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, probe.start)
        loop.add_signal_handler(signal.SIGUSR2, probe.stop)
        # PROBE_LAG=0: no 1 ms sampler, whose wake-ups would be counted among the broker's own
        lag = (
            asyncio.create_task(probe.sample_lag()) if os.environ.get('PROBE_LAG') != '0' else None
        )
        try:
            return await app.serve(settings)
        finally:
            if lag is not None:
                lag.cancel()
            probe.stop()

    if os.environ.get('PROBE_ASYNCIO') == '1':
        probe.time_callbacks()
        return asyncio.run(serve())
    import uvloop

    if os.environ.get('PROBE_COUNT') == '1':
        return uvloop.run(serve(), loop_factory=lambda: counting_loop(probe))
    return uvloop.run(serve())


if __name__ == '__main__':
    raise SystemExit(main())
