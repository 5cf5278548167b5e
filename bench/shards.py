"""
The scale matrix's row g (bench/matrix.sh g): what each run cost the shards of a Redis Cluster,
and the row's table. bench/redis_cluster.sh samples every node before and after a run (CPU
seconds, commands processed, MOVED/ASK/CROSSSLOT error replies, keys); ``report`` turns the two
samples and the run's own result (the last line bench/load.py or bench/shared.py appended to the
JSON file) into one record: msg/s, broker µs/msg, Redis µs/msg summed over the shards and per
shard, each shard's share of the Redis CPU and of the commands, and the errors that would show
a client chasing slots. ``table`` prints the records of row g as markdown, medians over rounds.

usage: python bench/shards.py report --json J --skip LINES --label L --part 'a saturation'
           --shards 3 --messages 50000 --before "$(cluster_sample)" --after "$(cluster_sample)"
       python bench/shards.py table J
       python bench/shards.py commands STATS.before STATS.after MESSAGES
           (bench/matrix.sh keeps each run's cluster_commandstats dumps as commandstats-g-*)
"""

import argparse
import json
import statistics
import sys
from typing import Any

Record = dict[str, Any]
FIELDS = ('cpu_s', 'commands', 'moved', 'ask', 'crossslot', 'keys')
"""One node's line of ``cluster_sample``, in order."""


def parse_sample(text: str) -> list[dict[str, float]]:
    nodes = []
    for line in text.strip().splitlines():
        values = line.split()
        if len(values) != len(FIELDS):
            raise SystemExit(f'a node sample has {len(values)} fields, not {len(FIELDS)}: {line!r}')
        nodes.append(dict(zip(FIELDS, map(float, values), strict=True)))
    return nodes


def run_result(path: str, skip: int) -> Record:
    """The run's figures: the first line of ``path`` past its first ``skip`` lines (none if the
    run wrote none; bench/load.py nests them in ``median``)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()[skip:]
    except FileNotFoundError:
        lines = []
    first: Record = json.loads(lines[0]) if lines and lines[0].strip() else {'errors': ['none']}
    flat: Record = first.get('median', first)
    rate = flat.get('msgs_per_s', flat.get('msg_per_s'))
    reps = first.get('reps', [flat])
    return {
        'msg_per_s': rate,
        'broker_us_per_msg': flat.get('broker_us_per_msg'),
        'p50_ms': flat.get('p50_ms'),
        'p99_ms': flat.get('p99_ms'),
        'complete': rate is not None
        and all(not r.get('errors') and not r.get('missing') for r in reps),
    }


def shares(values: list[float]) -> list[float]:
    total = sum(values)
    return [round(100 * v / total, 1) if total else 0.0 for v in values]


def report(opts: argparse.Namespace) -> Record:
    before, after = parse_sample(opts.before), parse_sample(opts.after)
    if len(before) != len(after):
        raise SystemExit('the two samples name a different number of nodes')
    delta = {k: [a[k] - b[k] for b, a in zip(before, after, strict=True)] for k in FIELDS}
    n = opts.messages
    cpu = delta['cpu_s']
    record: Record = {
        'row': 'g',
        'label': opts.label,
        'part': opts.part,
        'shards': opts.shards,
        'round': opts.round,
        'messages': n,
        **run_result(opts.json, opts.skip),
        'redis_us_per_msg': round(1e6 * sum(cpu) / n, 2),
        'redis_us_per_msg_per_shard': [round(1e6 * c / n, 2) for c in cpu],
        'redis_cpu_share_pct': shares(cpu),
        'commands_per_msg': round(sum(delta['commands']) / n, 3),
        'commands_share_pct': shares(delta['commands']),
        'moved': int(sum(delta['moved'])),
        'ask': int(sum(delta['ask'])),
        'crossslot': int(sum(delta['crossslot'])),
        'keys': [int(a['keys']) for a in after],
        'addresses_per_shard': [int(v) for v in opts.spread.split()] if opts.spread else None,
    }
    return record


def med(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def shown(value: float | None, spec: str = ',.0f') -> str:
    return '-' if value is None else format(value, spec)


def imbalance(share: list[float]) -> float | None:
    """The busiest shard's share of the Redis CPU over an even share (1.0: even)."""
    return max(share) * len(share) / 100 if share and sum(share) else None


def table(path: str) -> str:
    """Medians over the complete rounds of each run and shard count (a run cut short counts in
    none of them; how many were is said). Per shard, busiest first: which shard serves an
    address depends on its name, and each round names its addresses afresh."""
    with open(path) as f:
        records = [r for line in f if line.strip() and (r := json.loads(line)).get('row') == 'g']
    groups: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        groups.setdefault((r['part'], r['shards']), []).append(r)
    rows = [
        '| run | shards | rounds | msg/s | p99 ms | broker µs/msg | Redis µs/msg, all shards '
        '| Redis µs/msg per shard, busiest first | Redis CPU share per shard % | busiest / even '
        '| commands/msg | MOVED, ASK, CROSSSLOT |',
        '|---|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    order = {part: i for i, part in reversed(list(enumerate(r['part'] for r in records)))}
    for (part, shards), every in sorted(groups.items(), key=lambda g: (g[0][1], order[g[0][0]])):
        rs = [r for r in every if r['complete'] and r['msg_per_s'] is not None]
        cut = len(every) - len(rs)
        if not rs:
            rows.append(f'| {part} | {shards} | 0 ({cut} cut short) |' + ' |' * 9)
            continue
        spread = [sorted(r['redis_us_per_msg_per_shard'], reverse=True) for r in rs]
        per_shard = '/'.join(
            shown(med([s[i] for s in spread]), '.1f') for i in range(len(spread[0]))
        )
        shares = [sorted(r['redis_cpu_share_pct'], reverse=True) for r in rs]
        share = [med([s[i] for s in shares]) or 0.0 for i in range(len(shares[0]))]
        errors = '/'.join(str(sum(r[k] for r in rs)) for k in ('moved', 'ask', 'crossslot'))
        rounds = f'{len(rs)}' + (f' ({cut} cut short)' if cut else '')
        rows.append(
            f'| {part} | {"standalone" if shards == 0 else shards} | {rounds} '
            f'| {shown(med([r["msg_per_s"] for r in rs]))} '
            f'| {shown(med([r["p99_ms"] for r in rs]), ".2f")} '
            f'| {shown(med([r["broker_us_per_msg"] for r in rs]), ".1f")} '
            f'| {shown(med([r["redis_us_per_msg"] for r in rs]), ".1f")} | {per_shard} '
            f'| {"/".join(f"{s:.0f}" for s in share)} '
            f'| {shown(med([imbalance(r["redis_cpu_share_pct"]) for r in rs]), ".2f")} '
            f'| {shown(med([r["commands_per_msg"] for r in rs]), ".2f")} | {errors} |'
        )
    return '\n'.join(rows)


def commandstats(path: str) -> dict[tuple[str, str], tuple[int, int]]:
    """``cluster_commandstats`` output: (port, command) -> (calls, µs)."""
    stats = {}
    with open(path) as f:
        for line in f:
            port, _, rest = line.strip().partition(' ')
            name, _, fields = rest.removeprefix('cmdstat_').partition(':')
            kv = dict(field.split('=', 1) for field in fields.split(','))
            stats[port, name] = int(kv['calls']), int(kv['usec'])
    return stats


def commands(before_path: str, after_path: str, messages: int) -> str:
    """Per node, each command's calls and Redis µs per message between two dumps, most costly
    first: where the Redis side of a run's cost went."""
    before, after = commandstats(before_path), commandstats(after_path)
    moved = []
    for key, (calls, usec) in after.items():
        calls0, usec0 = before.get(key, (0, 0))
        if calls > calls0:
            moved.append((key[0], (usec - usec0) / messages, (calls - calls0) / messages, key[1]))
    moved.sort(key=lambda m: (m[0], -m[1]))
    return '\n'.join(
        f'{port} {name:<16} {calls:8.3f} calls/msg {usec:7.2f} µs/msg'
        for port, usec, calls, name in moved
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or '').strip().split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    r = sub.add_parser('report', help="one run's record, appended to --json")
    r.add_argument('--json', required=True, help='the JSON lines file the run appended to')
    r.add_argument('--skip', type=int, default=0, help='lines the file had before the run')
    r.add_argument('--label', required=True)
    r.add_argument('--part', required=True, help="the run's name in the table")
    r.add_argument('--shards', type=int, required=True, help='0: standalone Redis')
    r.add_argument('--round', type=int, default=1)
    r.add_argument('--messages', type=int, required=True)
    r.add_argument('--before', required=True, help='cluster_sample before the run')
    r.add_argument('--after', required=True, help='cluster_sample after it')
    r.add_argument('--spread', default='', help='addresses per shard (bench/slots.py spread)')
    t = sub.add_parser('table', help="row g's records as markdown, medians over rounds")
    t.add_argument('path')
    c = sub.add_parser('commands', help='per node and command: calls and µs per message')
    c.add_argument('before')
    c.add_argument('after')
    c.add_argument('messages', type=int)
    opts = parser.parse_args(argv)
    if opts.command == 'commands':
        print(commands(opts.before, opts.after, max(1, opts.messages)))
        return 0
    if opts.command == 'table':
        print(table(opts.path))
        return 0
    if opts.messages <= 0:
        raise SystemExit('--messages must be positive')
    record = report(opts)
    with open(opts.json, 'a') as f:
        f.write(json.dumps(record) + '\n')
    print(
        f'  {opts.label}: Redis {record["redis_us_per_msg"]} µs/msg over the shards '
        f'{record["redis_us_per_msg_per_shard"]}, CPU share {record["redis_cpu_share_pct"]} %, '
        f'commands/msg {record["commands_per_msg"]} (share {record["commands_share_pct"]} %), '
        f'MOVED {record["moved"]} ASK {record["ask"]} CROSSSLOT {record["crossslot"]}, '
        f'keys {record["keys"]}'
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
