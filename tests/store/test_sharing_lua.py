"""``lua/share.lua`` is ``routing/sharing.py``: the same decisions on the same inputs, run on a
real Redis over random sequences of fetches by three replicas."""

import random

import pytest
import redis.asyncio

from shoal_broker.routing.sharing import LAPSE_MS, Share, grant
from shoal_broker.store import scripts

HARNESS = """
local shares, ids = share_records(KEYS[1])
local granted = share_grant(shares, ids, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]),
                            tonumber(ARGV[4]), tonumber(ARGV[5]))
local flat = {}
for _, id in ipairs(ids) do
  flat[#flat + 1] = id
  flat[#flat + 1] = share_encode(shares[id])
end
redis.call('HSET', KEYS[1], unpack(flat))
return granted
"""


def _encode(share: Share) -> str:
    return (
        f'{share.consumers} {share.credit} {share.reserved} {share.current} '
        f'{share.fetched_ms} {share.reserved_ms}'
    )


Step = tuple[str, int, int, int, int]
"""A fetch: replica, consumers, free credit, entries that arrived since the last fetch, ms since
the last fetch."""


def _random_steps(seed: int) -> list[Step]:
    rng = random.Random(seed)
    return [
        (
            rng.choice('abc'),
            rng.choice([1, 1, 1, 2, 3]),
            rng.choice([0, 1, 5, 10, 1000, 1000, 1000, 3000]),
            rng.choice([0, 0, 1, 1, 2, 20, 50]),
            rng.choice([0, 5, 16, 100, LAPSE_MS, LAPSE_MS + 1]),
        )
        for _ in range(300)
    ]


TRICKLE: list[Step] = [('a', 1, 1000, 0, 0), ('b', 1, 1000, 0, 0)] + [
    (replica, 1, 1000, 1 if replica == 'a' else 0, 16) for _ in range(5) for replica in 'ab'
]
"""Two equal replicas, one message at a time: the round robin's ties decide."""


@pytest.mark.parametrize(
    'steps',
    [*(_random_steps(seed) for seed in range(5)), TRICKLE],
    ids=[*map(str, range(5)), 'trickle'],
)
async def test_the_lua_rule_decides_as_the_python_rule(
    client: redis.asyncio.Redis, steps: list[Step]
) -> None:
    key = f'test-shares-{random.random()}'
    source = scripts.source('share') + HARNESS
    shares: dict[str, Share] = {}
    now, available = 1_700_000_000_000, 0
    try:
        for replica, consumers, credit, arrived, elapsed in steps:
            available += arrived
            now += elapsed
            expected = grant(shares, replica, consumers, credit, available, now)
            got = await client.eval(source, 1, key, replica, consumers, credit, available, now)
            assert int(got) == expected
            stored = {k.decode(): v.decode() for k, v in (await client.hgetall(key)).items()}
            assert stored == {r: _encode(s) for r, s in shares.items()}
            available -= min(expected, available)
    finally:
        await client.delete(key)
