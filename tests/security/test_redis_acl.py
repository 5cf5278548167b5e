"""
A least-privilege Redis account: the memory watermark never switches itself off unseen.

Without ``INFO`` the broker cannot sample Redis memory. Asked for a watermark, it refuses to
start and names the command (the documented choice: the alternative was accepting messages up to
Redis's own maxmemory). ``INFO`` revoked while it runs: ERROR in the log,
``shoal_background_task_failures_total{task="store_memory"}``, and ``/readyz`` 503 until it is
granted again.
"""

import json
import re
from collections.abc import Callable, Iterator

import pytest
import redis as redis_lib
from processes import LOOPBACK, BrokerProcess, RedisServer, wait_for

PASSWORD = 'shoal-acl-secret'
FULL = ['on', f'>{PASSWORD}', '~*', '&*', '+@all']


@pytest.fixture
def acl_redis() -> Iterator[tuple[RedisServer, redis_lib.Redis]]:
    server = RedisServer(None, '--maxmemory', '64mb', '--maxmemory-policy', 'noeviction')
    admin = redis_lib.Redis(host=LOOPBACK, port=server.port)
    try:
        yield server, admin
    finally:
        admin.close()
        server.stop()


def url(server: RedisServer) -> str:
    return f'redis://shoal:{PASSWORD}@{LOOPBACK}:{server.port}/0'


def test_a_watermark_without_info_refuses_to_start_and_names_the_command(
    acl_redis: tuple[RedisServer, redis_lib.Redis], start_broker: Callable[..., BrokerProcess]
) -> None:
    server, admin = acl_redis
    admin.acl_setuser('shoal', reset=True, enabled=True, passwords=[f'+{PASSWORD}'],
                      keys=['*'], channels=['*'], commands=['+@all', '-info'])  # fmt: skip
    with pytest.raises(AssertionError) as refused:
        start_broker(redis_url=url(server))
    assert 'may not run INFO' in str(refused.value)
    assert 'SHOAL_REDIS_MEMORY_HIGH_WATERMARK' in str(refused.value)
    # without a watermark the same account is enough
    b = start_broker(redis_url=url(server), env={'SHOAL_REDIS_MEMORY_HIGH_WATERMARK': '0'})
    assert b.http_get('/readyz')[0] == 200


def failures(broker: BrokerProcess) -> float:
    body = broker.http_get('/metrics')[1].decode()
    found = re.search(r'^shoal_background_task_failures_total\{task="store_memory"\} (\S+)$', body,
                      re.MULTILINE)  # fmt: skip
    return float(found.group(1)) if found else 0.0


def test_info_revoked_at_run_time_is_reported_at_once(
    acl_redis: tuple[RedisServer, redis_lib.Redis], start_broker: Callable[..., BrokerProcess]
) -> None:
    server, admin = acl_redis
    admin.acl_setuser('shoal', reset=True, enabled=True, passwords=[f'+{PASSWORD}'],
                      keys=['*'], channels=['*'], commands=['+@all'])  # fmt: skip
    b = start_broker(redis_url=url(server))
    admin.acl_setuser('shoal', enabled=True, commands=['-info'])  # enabled: else 'off'
    wait_for(lambda: b.http_get('/readyz')[0] == 503, 10, 'readiness withdrawn')
    assert json.loads(b.http_get('/readyz')[1])['store_memory_watch'] is False
    assert 'ERROR' in next(line for line in b.log().splitlines() if 'watermark is off' in line)
    assert failures(b) >= 1
    admin.acl_setuser('shoal', enabled=True, commands=['+info'])
    wait_for(lambda: b.http_get('/readyz')[0] == 200, 10, 'readiness restored')
