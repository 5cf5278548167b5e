"""
Medians and Shoal/RabbitMQ ratios over interleaved rounds (bench/peers.sh).

Reads every ``*/results.jsonl`` (bench/load.py) under the directory given, groups the runs by
system (the first word of the label: ``shoal`` or ``rabbitmq``) and row (the rest), and prints
one markdown row per benchmark row: median throughput (deliveries/s for fan-out, messages/s
otherwise), p50/p99, broker CPU µs per message, the per-round values, and the ratio. Latency
rows compare p50 and p99 (lower is better); throughput rows compare rates (higher is better).
Then each system's share of the machine per round (``machine.json``, written by bench/peers.sh):
busy and steal %, steal being the time the hypervisor gave the vCPUs to someone else.

usage: python bench/compare.py OUTDIR
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(root: Path) -> None:
    runs: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for path in sorted(root.glob('*/results.jsonl')):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            system, _, row = record['median']['label'].partition(' ')
            runs[(system, row)] += [r for r in record['reps'] if r['complete']]
    rows = sorted({row for _, row in runs})
    print('| row | Shoal | RabbitMQ | Shoal / RabbitMQ | Shoal rounds | RabbitMQ rounds |')
    print('|---|---|---|---|---|---|')
    for row in rows:
        cells, rounds, values = [], [], []
        for system in ('shoal', 'rabbitmq'):
            done = runs.get((system, row), [])
            cell, per_round, value = describe(row, done)
            cells.append(cell)
            rounds.append(per_round)
            values.append(value)
        ratio = '-'
        if all(v is not None for v in values):
            shoal, rabbit = values
            if 'latency' in row:
                ratio = f'p50 x{shoal[0] / rabbit[0]:.2f}, p99 x{shoal[1] / rabbit[1]:.2f}'
            else:
                ratio = f'**{shoal[0] / rabbit[0]:.2f}**'
        print(f'| {row} | {cells[0]} | {cells[1]} | {ratio} | {rounds[0]} | {rounds[1]} |')
    machine = machine_shares(root)
    if machine:
        print()
        for system, shares in machine.items():
            busy = ' / '.join(f'{b:.0f}' for b, _ in shares)
            steal = ' / '.join(f'{s:.1f}' for _, s in shares)
            print(f'{system} rounds: machine busy {busy} %, steal {steal} %')


def machine_shares(root: Path) -> dict[str, list[tuple[float, float]]]:
    """Busy and steal % per round directory (``shoal-1``, ``rabbitmq-1``, ...), in round order."""
    shares: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for path in root.glob('*-*/machine.json'):
        system, _, number = path.parent.name.rpartition('-')
        if not number.isdigit():
            continue
        record = json.loads(path.read_text())
        shares[system].append((int(number), record['busy_pct'], record['steal_pct']))
    return {
        system: [(busy, steal) for _, busy, steal in sorted(rounds)]
        for system, rounds in sorted(shares.items(), key=lambda item: item[0] != 'shoal')
    }


def describe(row: str, done: list[dict[str, float]]) -> tuple[str, str, tuple[float, ...] | None]:
    if not done:
        return '-', '-', None

    def median(key: str) -> float:
        found = [r[key] for r in done if r.get(key) is not None]
        return statistics.median(found) if found else float('nan')

    p50, p99 = median('p50_ms'), median('p99_ms')
    cpu = [r['broker_us_per_msg'] for r in done if r.get('broker_us_per_msg') is not None]
    us = f', {statistics.median(cpu):.0f} µs/msg' if cpu else ''
    if 'latency' in row:
        per_round = ' / '.join(f'{r["p99_ms"]:.2f}' for r in done if r.get('p99_ms'))
        return f'p50 {p50:.2f} ms, p99 {p99:.2f} ms{us}', f'p99 {per_round}', (p50, p99)
    key = 'deliveries_per_s' if 'fan-out' in row else 'msgs_per_s'
    rate = median(key)
    per_round = ' / '.join(f'{r[key]:.0f}' for r in done if r.get(key))
    unit = 'deliveries/s' if 'fan-out' in row else 'msg/s'
    return f'{rate:,.0f} {unit} (p99 {p99:.0f} ms{us})', per_round, (rate,)


if __name__ == '__main__':
    main(Path(sys.argv[1]))
