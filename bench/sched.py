"""
Where a run's CPU time went, from ``perf sched timehist`` output: each process's share of one CPU,
the machine's idle share, and which processes ran in the time bins where CPUs sat idle. A
closed-loop row on two vCPUs left a CPU idle ~13 % of the time while no process of the chain was
at its limit (docs/performance.md#idle-cpu): the bins show in which stretches that happens.

usage: perf sched timehist -i perf.data | python bench/sched.py --cpus 2 --name PID=broker ...
"""

import argparse
import collections
import sys
from collections.abc import Iterable


def parse(lines: Iterable[str]) -> list[tuple[float, str, float]]:
    """(time the task stopped running in s, task, ms it ran) for each timehist row."""
    rows = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6:
            continue
        try:
            stopped, ran = float(fields[0]), float(fields[-1])
        except ValueError:  # the header lines
            continue
        rows.append((stopped, fields[2], ran))
    return rows


def label(task: str, names: dict[str, str]) -> str:
    """``comm[pid]`` as the name given for its pid, ``idle`` for the idle task, else as it is."""
    if task.startswith('<idle>'):
        return 'idle'
    pid = task.rsplit('[', 1)[-1].rstrip(']').split('/')[-1]
    return names.get(pid, task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--cpus', type=int, required=True)
    parser.add_argument('--bin-ms', type=float, default=2.0)
    parser.add_argument('--name', action='append', default=[], help='PID=NAME, e.g. 1234=broker')
    args = parser.parse_args()
    names = dict(n.split('=', 1) for n in args.name)
    rows = parse(sys.stdin)
    if not rows:
        sys.exit('no perf sched timehist rows on stdin')
    start, end = rows[0][0], rows[-1][0]
    span_ms = (end - start) * 1000
    total: dict[str, float] = collections.defaultdict(float)
    bins: dict[int, dict[str, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float)
    )
    for stopped, task, ran in rows:
        who = label(task, names)
        total[who] += ran
        at, until = (stopped - start) * 1000 - ran, (stopped - start) * 1000
        while at < until:  # the run spread over the bins it covers
            index = int(at // args.bin_ms)
            step = min(until, (index + 1) * args.bin_ms) - at
            bins[index][who] += step
            at += step
    print(f'window {span_ms:.0f} ms on {args.cpus} CPUs')
    print('| process | share of one CPU |')
    print('|---|---|')
    for who, ms in sorted(total.items(), key=lambda item: -item[1])[:8]:
        print(f'| {who} | {100 * ms / span_ms:.1f} % |')
    idle = total.get('idle', 0.0)
    print(f'\nmachine idle: {100 * idle / (span_ms * args.cpus):.1f} % of its CPU time')
    # who ran in the bins where the idle time fell: named processes only, as a set
    by_company: dict[str, float] = collections.defaultdict(float)
    named, noticed = set(names.values()), 0.05 * args.bin_ms
    for counts in bins.values():
        if counts.get('idle', 0.0) <= 0:
            continue
        present = sorted(w for w, ms in counts.items() if w in named and ms > noticed)
        by_company[' + '.join(present) or 'none of them'] += counts['idle']
    if idle:
        print(f'\nidle time by who ran in its {args.bin_ms:g} ms bin (named processes):')
        for company, ms in sorted(by_company.items(), key=lambda item: -item[1])[:8]:
            print(f'  {100 * ms / idle:5.1f} %  {company}')


if __name__ == '__main__':
    main()
