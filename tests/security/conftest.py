"""A broker that requires authentication: ANONYMOUS off, users from a users file.

The users file is written with the broker's own ``shoal user add`` code path (salted keys only).
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import BrokerProcess, RedisServer
from testusers import write_users


@pytest.fixture(scope='module')
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users(tmp_path_factory.mktemp('users') / 'users.json')


@pytest.fixture(scope='module')
def secure_broker(redis_server: RedisServer, users_file: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        redis_server.url,
        env={'SHOAL_USERS_FILE': str(users_file), 'SHOAL_ALLOW_ANONYMOUS': 'false'},
    )
    yield b
    b.stop()
