"""
``shoal user add``: put a user (salted SCRAM keys, never the password) and permissions in a users
file, the file the broker reads through ``SHOAL_USERS_FILE`` (or a Kubernetes Secret holding it).

The password is read from stdin (``--password-stdin``, for scripts) or prompted for; it is never
an argument, so it stays out of shell history and process listings.
"""

import argparse
import getpass
import sys
from collections.abc import Sequence

from shoal_broker.security.credentials import (
    DEFAULT_ITERATIONS,
    UsersFileError,
    make_user,
    write_user,
)
from shoal_broker.security.permissions import Operation, Permissions

PROG = 'shoal user'


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description='Manage the broker users file.')
    sub = p.add_subparsers(dest='command', required=True, metavar='COMMAND')
    add = sub.add_parser('add', help='add or replace a user', description='add or replace a user')
    add.add_argument('name')
    add.add_argument('--users-file', required=True, metavar='PATH', help='created if missing')
    secret = add.add_mutually_exclusive_group()
    secret.add_argument(
        '--password-stdin', action='store_true', help='read the password from stdin'
    )
    secret.add_argument(
        '--no-password',
        action='store_true',
        help='a user who may only authenticate with a TLS client certificate (CN = name)',
    )
    add.add_argument('--iterations', type=int, default=DEFAULT_ITERATIONS)
    for op in Operation:
        add.add_argument(
            f'--{op}',
            action='append',
            default=[],
            metavar='PATTERN',
            help=f'address pattern the user may {op} (repeatable; * matches any run)',
        )
    return p


def _password(args: argparse.Namespace) -> str | None:
    if args.no_password:
        return None
    if args.password_stdin:
        password = sys.stdin.readline().rstrip('\n')
    else:
        password = getpass.getpass(f'password for {args.name}: ')
    if not password:
        raise ValueError('the password must not be empty')
    return password


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        permissions = Permissions({op: tuple(getattr(args, op.value)) for op in Operation})
        user = make_user(args.name, _password(args), permissions, iterations=args.iterations)
        write_user(args.users_file, user)
    except (ValueError, OSError) as exc:
        kind = 'bad users file' if isinstance(exc, UsersFileError) else 'error'
        sys.stderr.write(f'{PROG}: {kind}: {exc}\n')
        return 1 if isinstance(exc, OSError) else 2
    sys.stdout.write(f'user {args.name!r} written to {args.users_file}\n')
    return 0
