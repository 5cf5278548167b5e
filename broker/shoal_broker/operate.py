"""
``shoal <operation>``: the management API's operations from a terminal (browse, purge, move,
retry, delete a message, pause, resume, list and close connections).

The writes go through a broker's management API rather than straight to Redis, so that they are
authorized, audited and counted as the API's are, and a move keeps the API's crash-safe steps.
Any replica answers for the whole cluster. Output is the API's JSON.

Exit codes: 0 done, 1 the broker refused (the reason on stderr) or is unreachable, 2 usage.
"""

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

ENV_API_URL = 'SHOAL_API_URL'
ENV_API_USER = 'SHOAL_API_USER'
ENV_API_PASSWORD = 'SHOAL_API_PASSWORD'
DEFAULT_API_URL = 'http://127.0.0.1:8080/api'
"""``make run``'s HTTP port."""

COMMANDS = (
    'browse', 'purge', 'move', 'retry', 'delete-message', 'pause', 'resume', 'connections',
    'close-connection',
)  # fmt: skip
HELPS = {
    'browse': 'show messages of a queue without consuming them',
    'purge': 'remove every message of a queue that no consumer holds',
    'move': 'move messages of a queue (all, --ids or --selector) to another address',
    'retry': 'send dead-lettered or expired messages back to their original address',
    'delete-message': 'delete one message of a queue by its id',
    'pause': 'pause delivery from a queue on every replica',
    'resume': 'resume delivery from a queue',
    'connections': 'list the client connections of every replica',
    'close-connection': 'close a client connection (on whichever replica holds it)',
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog='shoal', description='Operate a Shoal cluster.')
    p.add_argument(
        '--api-url',
        metavar='URL',
        help=f'management API (default: ${ENV_API_URL}, else {DEFAULT_API_URL})',
    )
    p.add_argument('--user', help=f'API user (default: ${ENV_API_USER}; none: ANONYMOUS)')
    sub = p.add_subparsers(dest='command', required=True, metavar='COMMAND')
    for command in COMMANDS:
        c = sub.add_parser(command, help=HELPS[command], description=HELPS[command])
        if command == 'close-connection':
            c.add_argument('replica')
            c.add_argument('connection')
        elif command != 'connections':
            c.add_argument('queue')
        if command == 'move':
            c.add_argument('target')
        if command in ('move', 'retry'):
            pick = c.add_mutually_exclusive_group()
            pick.add_argument('--ids', nargs='+', metavar='ID', help='only these messages')
            pick.add_argument('--selector', help='only the messages this JMS selector matches')
        if command == 'browse':
            c.add_argument('--selector', help='only the messages this JMS selector matches')
            c.add_argument('--limit', type=int, default=50, help='messages per page')
            c.add_argument('--cursor', help="where to start (a previous page's next)")
        if command == 'delete-message':
            c.add_argument('id')
    return p  # fmt: skip


def request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """(method, path with query, JSON body) of the command."""
    q = f'/queues/{urllib.parse.quote(getattr(args, "queue", ""), safe="")}'
    body: dict[str, Any] = {}
    if args.command in ('move', 'retry'):
        if args.command == 'move':
            body['target'] = args.target
        if args.ids:
            body['ids'] = args.ids
        if args.selector is not None:
            body['selector'] = args.selector
    if args.command == 'browse':
        query = {'limit': args.limit, **{k: v for k, v in (
            ('selector', args.selector), ('cursor', args.cursor)) if v is not None}}  # fmt: skip
        return 'GET', f'{q}/messages?{urllib.parse.urlencode(query)}', None
    if args.command == 'delete-message':
        return 'DELETE', f'{q}/messages/{urllib.parse.quote(args.id, safe="")}', None
    if args.command == 'connections':
        return 'GET', '/connections', None
    if args.command == 'close-connection':
        replica = urllib.parse.quote(args.replica, safe='')
        return 'DELETE', f'/connections/{replica}/{urllib.parse.quote(args.connection)}', None
    return 'POST', f'{q}/{args.command}', body


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    base = (args.api_url or os.environ.get(ENV_API_URL) or DEFAULT_API_URL).rstrip('/')
    method, path, body = request(args)
    call = urllib.request.Request(
        base + path, method=method, data=None if body is None else json.dumps(body).encode()
    )
    call.add_header('Content-Type', 'application/json')
    user = args.user or os.environ.get(ENV_API_USER)
    if user:
        secret = f'{user}:{os.environ.get(ENV_API_PASSWORD, "")}'.encode()
        call.add_header('Authorization', 'Basic ' + base64.b64encode(secret).decode())
    try:
        with urllib.request.urlopen(call, timeout=600) as answer:
            sys.stdout.write(json.dumps(json.loads(answer.read()), indent=2) + '\n')
            return 0
    except urllib.error.HTTPError as exc:
        said = exc.read().decode(errors='replace')
        sys.stderr.write(f'shoal: {exc.code} {said}\n')
        return 1
    except (urllib.error.URLError, OSError) as exc:
        sys.stderr.write(f'shoal: management API at {base} unreachable: {exc}\n')
        return 1
