"""Test users of a secured broker: names, passwords, permissions, and their users file."""

from pathlib import Path

from shoal_broker.security.credentials import make_user, write_user
from shoal_broker.security.permissions import Operation, Permissions

PASSWORDS = {'alice': 'alice-secret', 'bob': 'bob-secret', 'carol': 'carol-secret'}
PERMISSIONS = {
    # producer and consumer of orders; may create durable subscriptions on news topics
    'alice': {
        Operation.SEND: ('orders.*', 'news.*', 'temp-*'),
        Operation.CONSUME: ('orders.*', 'news.*'),
        Operation.MANAGE: ('news.*',),
    },
    # may only browse orders and send to audit
    'bob': {Operation.BROWSE: ('orders.*',), Operation.SEND: ('audit',)},
    # everything (used by limit tests)
    'carol': {op: ('*',) for op in Operation},
}


def write_users(path: Path) -> Path:
    for name, password in PASSWORDS.items():
        write_user(str(path), make_user(name, password, Permissions(PERMISSIONS[name])))
    write_user(str(path), make_user('certy', None, Permissions({Operation.CONSUME: ('*',)})))
    return path
