"""
``shoal``: look at what a Shoal cluster holds, straight from its Redis.

Every broker replica is stateless, so this reads Redis (through the read-only
:mod:`shoal_broker.store.inspect`) rather than asking a broker: it lists addresses, queues and
named JMS subscriptions with their backlog, consumers per replica and each replica's share of the
deliveries (so a replica whose consumers get nothing shows), and the ClientIDs held. Human
output is an aligned table; ``--json`` prints a JSON array of objects.

Without ``--redis-url`` or ``SHOAL_REDIS_URL`` it looks for a running broker with an embedded
Redis (``make run``), in ``SHOAL_DATA_DIR`` (default ``.data/redis``) and ``$XDG_RUNTIME_DIR``
(``store/discovery.py``).

Exit codes: 0 listed, 1 Redis unreachable or refusing, 2 usage (including no Redis URL).
"""

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shoal_broker import operate, useradmin
from shoal_broker.errors import StoreUnavailable
from shoal_broker.settings import ENV_REDIS_URL, BrokerSettings
from shoal_broker.store import discovery
from shoal_broker.store.inspect import (
    AddressInfo,
    ClientInfo,
    Inspector,
    QueueInfo,
    SubscriptionInfo,
)

PROG = 'shoal'
COMMANDS = ('addresses', 'queues', 'subscriptions', 'clients')
JSON_HELP = 'print a JSON array of objects instead of a table'

Columns = Sequence[tuple[str, Callable[[Any], object]]]
"""A table: header and how to get the cell from a row, per column."""


def _consumers(per_replica: dict[str, int]) -> str:
    return ','.join(f'{replica}={n}' for replica, n in per_replica.items())


def _shares(delivered: dict[str, int]) -> str:
    """Each replica's share of the deliveries, in whole percent."""
    total = sum(delivered.values())
    return ','.join(
        f'{replica}={round(100 * n / total)}%' for replica, n in delivered.items() if total
    )


def _standby(line: list[str]) -> str:
    """An exclusive entity's standby consumers, next in line first."""
    return ','.join(line[1:])


TABLES: dict[str, Columns] = {
    'addresses': [('NAME', lambda r: r.name), ('KIND', lambda r: r.kind)],
    'queues': [
        ('NAME', lambda r: r.name),
        ('BACKLOG', lambda r: r.backlog),
        ('READY', lambda r: r.ready),
        ('IN-FLIGHT', lambda r: r.in_flight),
        ('CONSUMERS', lambda r: _consumers(r.consumers)),
        ('DELIVERED', lambda r: _shares(r.delivered)),
        ('ACTIVE', lambda r: r.line[0] if r.line else ''),
        ('STANDBY', lambda r: _standby(r.line)),
        ('ACTIVE-GROUPS', lambda r: r.active_groups or ''),
        ('LAST-VALUES', lambda r: r.last_values or ''),
    ],
    'subscriptions': [
        ('NAME', lambda r: r.name),
        ('KIND', lambda r: r.kind),
        ('NAMESPACE', lambda r: r.namespace),
        ('TOPIC', lambda r: r.topic),
        ('CONSUMERS', lambda r: _consumers(r.consumers)),
        ('DELIVERED', lambda r: _shares(r.delivered)),
        ('ACTIVE', lambda r: r.line[0] if r.line else ''),
        ('STANDBY', lambda r: _standby(r.line)),
        ('BACKLOG', lambda r: r.backlog),
        ('NO-LOCAL', lambda r: 'yes' if r.no_local else 'no'),
        ('SELECTOR', lambda r: r.selector),
    ],
    'clients': [
        ('CLIENT-ID', lambda r: r.client_id),
        ('REPLICA', lambda r: r.replica),
        ('CONNECTION', lambda r: r.connection),
    ],
}
"""Column order is the human output's; ``--json`` carries every field."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description='List what a Shoal cluster holds in Redis (read-only).',
        epilog='Exit codes: 0 ok, 1 Redis unreachable, 2 usage or no Redis URL.',
    )
    p.add_argument(
        '--redis-url',
        metavar='URL',
        help=f'Redis URL of the cluster (default: ${ENV_REDIS_URL}, else the broker `make run` '
        'started from this directory)',
    )
    p.add_argument('--json', action='store_true', help=JSON_HELP)
    sub = p.add_subparsers(dest='command', required=True, metavar='COMMAND')
    helps = {
        'addresses': 'every address and its kind (queue or topic)',
        'queues': 'queues: backlog (ready + in flight), consumers and delivered share per replica, '
        'the active and standby consumers of an exclusive queue, and the keys a last-value '
        'queue holds a newest message for, and the message groups a replica owns',
        'subscriptions': 'named JMS subscriptions: kind, namespace, selector, consumers and '
        'delivered share per replica, backlog',
        'clients': 'JMS ClientIDs held, and by which replica and connection',
    }
    sub.add_parser('user', help='add a user to a users file (shoal user add --help)')
    for command in operate.COMMANDS:
        sub.add_parser(command, help=f'{operate.HELPS[command]} (shoal {command} --help)')
    for command in COMMANDS:
        c = sub.add_parser(command, help=helps[command], description=helps[command])
        # also accepted after the command; SUPPRESS keeps a --json given before it
        c.add_argument('--json', action='store_true', default=argparse.SUPPRESS, help=JSON_HELP)
    return p


async def collect(inspector: Inspector, command: str) -> list[Any]:
    async with inspector:
        rows: Sequence[AddressInfo | QueueInfo | SubscriptionInfo | ClientInfo]
        if command == 'addresses':
            rows = await inspector.addresses()
        elif command == 'queues':
            rows = await inspector.queues()
        elif command == 'subscriptions':
            rows = await inspector.subscriptions()
        else:
            rows = await inspector.clients()
        return list(rows)


def table(rows: Sequence[Any], columns: Columns) -> str:
    """Left-aligned columns separated by two spaces; empty cells show ``-``."""
    cells = [[header for header, _ in columns]]
    for row in rows:
        cells.append([_cell(get(row)) for _, get in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return ''.join(
        '  '.join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        + '\n'
        for line in cells
    )


def _cell(value: object) -> str:
    return '-' if value is None or value == '' else str(value)


def render(rows: Sequence[Any], command: str, *, as_json: bool) -> str:
    if as_json:
        return json.dumps([dataclasses.asdict(row) for row in rows], indent=2) + '\n'
    return table(rows, TABLES[command])


def _fail(code: int, message: str) -> int:
    sys.stderr.write(f'{PROG}: {message}\n')
    return code


def _operation(argv: list[str]) -> bool:
    """Whether the command line names one of the management API's operations (the listings'
    commands take no positional argument, so such a word is the command)."""
    return any(word in operate.COMMANDS or word in ('--api-url', '--user') for word in argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['user']:  # the users file, not Redis: its own parser
        return useradmin.main(argv[1:])
    if _operation(argv):  # a write or a browse: through a broker's management API
        return operate.main(argv)
    args = parser().parse_args(argv)
    url: str | None = args.redis_url
    looked: tuple[str, ...] = ()
    if not url:
        try:
            store = BrokerSettings.from_env().store
        except ValueError as exc:
            return _fail(2, f'bad environment: {exc}')
        url = store.redis_url
        if not url:  # a broker with an embedded Redis, as `make run` starts, says where it is
            found = discovery.discover(store.data_dir)
            url, looked = found.url, found.looked
    if not url:
        return _fail(
            2,
            f'no Redis URL: pass --redis-url or set {ENV_REDIS_URL}; found no running broker '
            f'with an embedded Redis (looked in {"; ".join(looked)})',
        )
    try:
        inspector = Inspector.from_url(url)
    except ValueError as exc:  # redis-py's verdict on the URL
        return _fail(2, f'bad Redis URL: {exc}')
    try:
        rows = asyncio.run(collect(inspector, args.command))
    except StoreUnavailable as exc:
        return _fail(1, str(exc))
    try:
        sys.stdout.write(render(rows, args.command, as_json=args.json))
        sys.stdout.flush()
    except BrokenPipeError:  # piped into head: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
