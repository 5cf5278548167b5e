"""
Deciding who a peer is: the SASL mechanisms on offer and each one's exchange, without the frames.

``amqp/sasl.py`` carries the bytes; this module answers them. Every failure is an
``AuthenticationFailed`` whatever the reason (unknown user, wrong password, mechanism not
offered; ``CredentialsRefused`` when a credential was checked), and an unknown name walks the
same path as a known one, against a mock user: the peer learns nothing about which users exist.
"""

import dataclasses
import importlib
import logging
import os
import types
from collections.abc import Callable
from typing import Final

from shoal_broker.security.credentials import (
    SCRAM_HASHES,
    MockUsers,
    User,
    UsersFile,
    UsersFileError,
    parse_users,
    password_matches,
)
from shoal_broker.security.permissions import Permissions

logger = logging.getLogger(__name__)

ANONYMOUS: Final = 'ANONYMOUS'
PLAIN: Final = 'PLAIN'
EXTERNAL: Final = 'EXTERNAL'
ANONYMOUS_USER: Final = 'anonymous'


class AuthenticationFailed(Exception):
    """The peer is not let in (deliberately without saying why)."""


class CredentialsRefused(AuthenticationFailed):
    """A credential was checked and refused: an unknown user, a wrong password or SCRAM proof, a
    certificate naming no user. Only these count toward the failed-login throttle
    (``amqp/guard.py``): they are what guessing passwords produces, while a mechanism not offered
    or a malformed response checks no credential at all."""


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated peer. ``permissions`` None: no users file, so no restrictions."""

    name: str
    mechanism: str
    permissions: Permissions | None


class UsersSource:
    """The users file, re-read when it changes (a Kubernetes Secret update swaps it in place).

    A file that no longer parses is reported and the last good content kept: a typo in an
    update must not lock everyone out, nor let everyone in.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._current = self._read()

    def _read(self) -> UsersFile:
        st = os.stat(self.path)
        with open(self.path, encoding='utf-8') as f:
            parsed = parse_users(f.read())
        self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        return parsed

    def current(self) -> UsersFile:
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_mtime_ns, st.st_size) != self._stamp:
                self._current = self._read()
                logger.info(
                    'users file %s reloaded (%d users)', self.path, len(self._current.users)
                )
        except (OSError, UsersFileError) as exc:
            logger.error('users file %s not reloaded, keeping the previous one: %s', self.path, exc)
        return self._current


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuthPolicy:
    allow_anonymous: bool
    users: UsersSource | None
    """None: no password or certificate users (then only ANONYMOUS can succeed)."""


class Exchange:
    """One mechanism's conversation: ``respond`` gets each client message and returns the next
    challenge, or (when done) the identity and the outcome's additional data."""

    def respond(self, data: bytes) -> bytes | tuple[Identity, bytes]:
        raise NotImplementedError


class Authenticator:
    def __init__(self, policy: AuthPolicy) -> None:
        self.policy = policy
        self._mocks = MockUsers()
        if policy.users is not None:
            # SCRAM is offered only with a users file. scramp (with asn1crypto, ~3 MiB of RSS,
            # docs/performance.md "Idle memory") is imported then, at start, rather than by the
            # first SCRAM login on the event loop; a broker without users never imports it.
            importlib.import_module('scramp')

    def mechanisms(self, peer_certificate_name: str | None) -> list[str]:
        """Offered in the order of Qpid JMS's preference (strongest first)."""
        offered: list[str] = []
        if peer_certificate_name is not None and self.policy.users is not None:
            offered.append(EXTERNAL)
        if self.policy.users is not None:
            offered += [*sorted(SCRAM_HASHES, reverse=True), PLAIN]
        if self.policy.allow_anonymous:
            offered.append(ANONYMOUS)
        return offered

    def start(self, mechanism: str, peer_certificate_name: str | None) -> Exchange:
        if mechanism not in self.mechanisms(peer_certificate_name):
            raise AuthenticationFailed(f'mechanism {mechanism!r} not offered')
        if mechanism == ANONYMOUS:
            return _Anonymous(self._anonymous_permissions())
        users = self._users()
        if mechanism == PLAIN:
            return _Plain(users, self._mocks)
        if mechanism == EXTERNAL:
            assert peer_certificate_name is not None
            return _External(users, peer_certificate_name)
        return _Scram(mechanism, users, self._mocks)

    def _users(self) -> UsersFile:
        assert self.policy.users is not None
        return self.policy.users.current()

    def _anonymous_permissions(self) -> Permissions | None:
        if self.policy.users is None:
            return None
        return self._users().anonymous


class _Anonymous(Exchange):
    def __init__(self, permissions: Permissions | None) -> None:
        self.permissions = permissions

    def respond(self, data: bytes) -> tuple[Identity, bytes]:
        return Identity(ANONYMOUS_USER, ANONYMOUS, self.permissions), b''


class _External(Exchange):
    """The TLS layer already verified the certificate; its subject's CN must name a user."""

    def __init__(self, users: UsersFile, certificate_name: str) -> None:
        self.users = users
        self.certificate_name = certificate_name

    def respond(self, data: bytes) -> tuple[Identity, bytes]:
        # the initial response may name an authorization identity: only the certificate's own
        requested = data.decode('utf-8', 'replace')
        user = self.users.users.get(self.certificate_name)
        if user is None or requested not in ('', self.certificate_name):
            raise CredentialsRefused('certificate does not name a user')
        return Identity(user.name, EXTERNAL, user.permissions), b''


class _Plain(Exchange):
    """RFC 4616: ``authzid NUL authcid NUL passwd`` in the initial response."""

    def __init__(self, users: UsersFile, mocks: MockUsers) -> None:
        self.users = users
        self.mocks = mocks

    def respond(self, data: bytes) -> tuple[Identity, bytes]:
        parts = data.split(b'\0')
        if len(parts) != 3:
            raise AuthenticationFailed('malformed PLAIN response')
        try:
            authzid, authcid, password = (p.decode('utf-8') for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed('malformed PLAIN response') from None
        user = self.users.users.get(authcid)
        known = user is not None and bool(user.keys)
        # the same PBKDF2 work for unknown names: no timing difference to learn names from
        checked = (
            user
            if known and user is not None
            else self.mocks.user(authcid, self.users.mock_iterations)
        )
        matches = password_matches(checked, password)
        if not (known and matches) or authzid not in ('', authcid):
            raise CredentialsRefused('wrong user name or password')
        assert user is not None
        return Identity(user.name, PLAIN, user.permissions), b''


def _scramp() -> types.ModuleType:
    """scramp, in ``sys.modules`` since an Authenticator with users was made (``__init__``
    imports it at start): a look-up per call, not an import at module load."""
    return importlib.import_module('scramp')


class _Scram(Exchange):
    """RFC 5802 via ``scramp``: client-first → server-first (challenge); client-final →
    server-final (the outcome's additional data)."""

    def __init__(self, mechanism: str, users: UsersFile, mocks: MockUsers) -> None:
        self.mechanism = mechanism
        self.users = users
        self.mocks = mocks
        self.user: User | None = None
        self.known = False
        self.server = _scramp().ScramMechanism(mechanism).make_server(self._auth_info)
        self.step: Callable[[bytes], bytes | tuple[Identity, bytes]] = self._first

    def _auth_info(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        user = self.users.users.get(name)
        self.known = user is not None and self.mechanism in user.keys
        if not self.known or user is None:
            user = self.mocks.user(name, self.users.mock_iterations)
        self.user = user
        keys = user.keys[self.mechanism]
        return user.salt, keys.stored_key, keys.server_key, user.iterations

    def respond(self, data: bytes) -> bytes | tuple[Identity, bytes]:
        return self.step(data)

    def _first(self, data: bytes) -> bytes:
        try:
            self.server.set_client_first(data.decode('utf-8'))
            challenge = self.server.get_server_first()
        except (UnicodeDecodeError, _scramp().ScramException) as exc:
            raise AuthenticationFailed(f'bad client-first message: {exc}') from None
        self.step = self._final
        return str(challenge).encode()

    def _final(self, data: bytes) -> tuple[Identity, bytes]:
        try:
            self.server.set_client_final(data.decode('utf-8'))
            final = self.server.get_server_final()
        except (UnicodeDecodeError, _scramp().ScramException) as exc:
            raise CredentialsRefused(f'SCRAM proof not accepted: {exc}') from None
        if not self.known or self.user is None:  # unreachable short of guessing the mock
            raise CredentialsRefused('unknown user')
        return Identity(self.user.name, self.mechanism, self.user.permissions), final.encode()
