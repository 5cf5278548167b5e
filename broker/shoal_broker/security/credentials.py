"""
Salted password verifiers, as SCRAM stores them (RFC 5802 §3), and the users file that holds them.

A password is never kept: each user has one salt and iteration count, and per SCRAM hash the
``StoredKey`` and ``ServerKey`` derived from it. SCRAM needs exactly these; PLAIN is checked by
deriving ``StoredKey`` from the offered password and comparing. A stolen users file therefore
gives an attacker a PBKDF2 work factor per guess, not a password.

The file is JSON so that a Kubernetes Secret can carry it unchanged (one key, mounted as a file);
``shoal user add`` writes it. Layout::

    {"users": {"alice": {"salt": "<base64>", "iterations": 4096,
                         "SCRAM-SHA-256": {"stored_key": "<base64>", "server_key": "<base64>"},
                         "SCRAM-SHA-512": {"stored_key": "<base64>", "server_key": "<base64>"},
                         "permissions": {"send": ["orders.*"], "consume": ["orders.*"]}}},
     "anonymous": {"permissions": {"consume": ["public.*"]}}}
"""

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from typing import Any, Final

from shoal_broker.security.permissions import Permissions

SCRAM_HASHES: Final = {'SCRAM-SHA-256': 'sha256', 'SCRAM-SHA-512': 'sha512'}
"""The SCRAM mechanisms offered, by the hash each one uses."""

DEFAULT_ITERATIONS: Final = 4096
"""RFC 7677's minimum for SCRAM-SHA-256; each PLAIN check and each stolen-file guess costs this."""

SALT_BYTES: Final = 16


class UsersFileError(ValueError):
    """The users file is not in the documented layout."""


@dataclasses.dataclass(frozen=True, slots=True)
class ScramKeys:
    stored_key: bytes
    server_key: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    name: str
    salt: bytes
    iterations: int
    keys: Mapping[str, ScramKeys]
    """Per SCRAM mechanism name."""
    permissions: Permissions


def derive_keys(password: str, salt: bytes, iterations: int, hash_name: str) -> ScramKeys:
    """``StoredKey`` and ``ServerKey`` for one hash (RFC 5802 §3)."""
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b'Client Key', hash_name)
    return ScramKeys(
        stored_key=hashlib.new(hash_name, client_key).digest(),
        server_key=hmac.digest(salted, b'Server Key', hash_name),
    )


def make_user(
    name: str,
    password: str | None,
    permissions: Permissions,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> User:
    """A user with SCRAM keys for ``password``; without a password, one who may only present a
    client certificate (SASL EXTERNAL)."""
    if password is None:
        return User(name, b'', 0, {}, permissions)
    salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
    keys = {mech: derive_keys(password, salt, iterations, h) for mech, h in SCRAM_HASHES.items()}
    return User(name, salt, iterations, keys, permissions)


def password_matches(user: User, password: str) -> bool:
    """PLAIN: derive SCRAM-SHA-256's StoredKey from the password; compare in constant time."""
    mech = 'SCRAM-SHA-256'
    if mech not in user.keys:
        return False
    offered = derive_keys(password, user.salt, user.iterations, SCRAM_HASHES[mech])
    return hmac.compare_digest(offered.stored_key, user.keys[mech].stored_key)


class MockUsers:
    """Stand-ins for names that do not exist, so that unknown and known users look alike.

    A SCRAM server must answer ``client-first`` with a salt and iteration count before it can know
    whether the proof is right; answering unknown names differently (an error, or a fresh random
    salt each time) tells an attacker which names exist. The mock salt is an HMAC of the name
    under a per-process secret: stable across attempts, unrelated to any real user.
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _bytes(self, *parts: str) -> bytes:
        return hmac.digest(self._secret, '\0'.join(parts).encode(), 'sha512')

    def user(self, name: str, iterations: int = DEFAULT_ITERATIONS) -> User:
        """Keys no password derives (so no PBKDF2 here: the check itself costs the same work).
        ``iterations`` should be what real users have, or the count would give mocks away."""
        keys = {
            mech: ScramKeys(
                self._bytes(name, mech, 'stored')[: hashlib.new(h).digest_size],
                self._bytes(name, mech, 'server')[: hashlib.new(h).digest_size],
            )
            for mech, h in SCRAM_HASHES.items()
        }
        salt = self._bytes(name, 'salt')[:SALT_BYTES]
        return User(name, salt, iterations, keys, Permissions.none())


@dataclasses.dataclass(frozen=True, slots=True)
class UsersFile:
    users: Mapping[str, User]
    anonymous: Permissions | None
    """Permissions of ANONYMOUS connections; None when the file gives none (then: all)."""

    @property
    def mock_iterations(self) -> int:
        """The iteration count most users have: what a mock user shows."""
        counts = [u.iterations for u in self.users.values() if u.keys]
        return max(set(counts), key=counts.count) if counts else DEFAULT_ITERATIONS


def _b64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise UsersFileError(f'{where} must be a base64 string')
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise UsersFileError(f'{where} is not valid base64') from exc


def _user(name: str, entry: Any) -> User:
    if not isinstance(entry, dict):
        raise UsersFileError(f'user {name!r} must be an object')
    if 'password' in entry:
        raise UsersFileError(f'user {name!r} has a plaintext password; store hashes only')
    permissions = Permissions.parse(entry.get('permissions', {}), f'user {name!r}')
    if 'salt' not in entry:  # a certificate-only user (SASL EXTERNAL)
        return User(name=name, salt=b'', iterations=0, keys={}, permissions=permissions)
    iterations = entry.get('iterations')
    if not isinstance(iterations, int) or iterations < 1:
        raise UsersFileError(f'user {name!r}: iterations must be a positive integer')
    keys = {}
    for mech in SCRAM_HASHES:
        k = entry.get(mech)
        if not isinstance(k, dict):
            raise UsersFileError(f'user {name!r} lacks {mech} keys')
        keys[mech] = ScramKeys(
            _b64(k.get('stored_key'), f'{name}.{mech}.stored_key'),
            _b64(k.get('server_key'), f'{name}.{mech}.server_key'),
        )
    return User(
        name=name,
        salt=_b64(entry.get('salt'), f'{name}.salt'),
        iterations=iterations,
        keys=keys,
        permissions=permissions,
    )


def parse_users(text: str) -> UsersFile:
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise UsersFileError(f'not JSON: {exc}') from exc
    if not isinstance(doc, dict):
        raise UsersFileError('the users file must be a JSON object')
    users = doc.get('users', {})
    if not isinstance(users, dict):
        raise UsersFileError('"users" must be an object')
    anonymous = doc.get('anonymous')
    if anonymous is not None and not isinstance(anonymous, dict):
        raise UsersFileError('"anonymous" must be an object')
    try:
        return UsersFile(
            users={name: _user(name, entry) for name, entry in users.items()},
            anonymous=(
                Permissions.parse(anonymous.get('permissions', {}), 'anonymous')
                if anonymous is not None
                else None
            ),
        )
    except UsersFileError:
        raise
    except ValueError as exc:  # from Permissions.parse
        raise UsersFileError(str(exc)) from exc


def user_entry(user: User) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if user.keys:
        entry['salt'] = base64.b64encode(user.salt).decode()
        entry['iterations'] = user.iterations
    for mech, keys in user.keys.items():
        entry[mech] = {
            'stored_key': base64.b64encode(keys.stored_key).decode(),
            'server_key': base64.b64encode(keys.server_key).decode(),
        }
    entry['permissions'] = user.permissions.to_json()
    return entry


def write_user(path: str, user: User) -> None:
    """Add or replace one user in the users file (created if missing), atomically."""
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except FileNotFoundError:
        text = ''
    parse_users(text)  # refuse to rewrite a file we could not read back
    doc = json.loads(text) if text.strip() else {}
    doc.setdefault('users', {})[user.name] = user_entry(user)
    tmp = f'{path}.tmp-{os.getpid()}'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write('\n')
    os.replace(tmp, path)
