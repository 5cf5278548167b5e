"""
Who calls the management API and what they may do: the AMQP listener's users file and
permissions, over HTTP Basic authentication, and the audit trail of every write.

A request with credentials is checked as a SASL PLAIN exchange (the same mock-user work for an
unknown name, so timing tells nothing); one without is ANONYMOUS, only where the broker offers
ANONYMOUS. Reads need ``browse`` on the address, writes ``manage``; what spans the whole
broker (connections) needs the permission on the pattern ``*``.
"""

import asyncio
import base64
import binascii
import hmac
import logging
from pathlib import Path

from shoal_broker.metrics.registry import MANAGEMENT_WRITES
from shoal_broker.security.authenticator import (
    ANONYMOUS,
    PLAIN,
    AuthenticationFailed,
    Authenticator,
    Identity,
)
from shoal_broker.security.permissions import Operation

audit_log = logging.getLogger('shoal_broker.audit')

EVERY_ADDRESS = '*'
"""The address a broker-wide operation's permission is checked against."""


class Access:
    """``credentials_dir``: where the operator's management Secret is mounted (files
    ``username`` and ``password``), one more user with every permission; '' for none."""

    def __init__(self, authenticator: Authenticator, credentials_dir: str = '') -> None:
        self.authenticator = authenticator
        self.credentials_dir = credentials_dir

    async def identify(self, authorization: str | None) -> Identity | None:
        """The caller, or None when it is not let in."""
        try:
            if authorization:
                scheme, _, encoded = authorization.partition(' ')
                user, sep, password = base64.b64decode(encoded, validate=True).partition(b':')
                if scheme.lower() != 'basic' or not sep:
                    return None
                if self._is_operator(user, password):
                    return Identity(user.decode(), PLAIN, None)
                exchange = self.authenticator.start(PLAIN, None)
                response = b'\0' + user + b'\0' + password
            else:
                exchange = self.authenticator.start(ANONYMOUS, None)
                response = b''
            # PBKDF2 takes milliseconds: off the event loop that carries the AMQP traffic
            done = await asyncio.to_thread(exchange.respond, response)
        except (AuthenticationFailed, binascii.Error, ValueError):
            return None
        return done[0] if isinstance(done, tuple) else None

    def _is_operator(self, user: bytes, password: bytes) -> bool:
        if not self.credentials_dir:
            return False
        try:
            folder = Path(self.credentials_dir)
            known_user = (folder / 'username').read_bytes().strip()
            known_password = (folder / 'password').read_bytes().strip()
        except OSError:
            return False
        same_user = hmac.compare_digest(user, known_user)
        return bool(known_password) and hmac.compare_digest(password, known_password) and same_user

    @staticmethod
    def allows(identity: Identity, operation: Operation, address: str) -> bool:
        return identity.permissions is None or identity.permissions.allows(operation, address)


def audit(identity: Identity, operation: str, target: str, outcome: str, detail: str) -> None:
    """One audit line and one count per write, whatever its outcome."""
    MANAGEMENT_WRITES.labels(operation, outcome).inc()
    audit_log.info(
        'audit user=%s operation=%s target=%s outcome=%s %s',
        identity.name, operation, target, outcome, detail,
    )  # fmt: skip
