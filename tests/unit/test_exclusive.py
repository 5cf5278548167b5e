"""Which entities are exclusive, and how a line's members read (routing/exclusive.py)."""

from shoal_broker.routing.exclusive import consumer_of, is_exclusive
from shoal_broker.settings import BrokerSettings


def test_a_declaration_wins_over_the_broker_wide_patterns() -> None:
    assert is_exclusive(True, 'orders', ())
    assert not is_exclusive(False, 'orders.eu', ('orders.*',))
    assert is_exclusive(None, 'orders.eu', ('fx', 'orders.*'))
    assert not is_exclusive(None, 'orders', ('orders.*',))


def test_the_patterns_come_from_a_comma_separated_setting() -> None:
    env = {'SHOAL_EXCLUSIVE_ADDRESSES': ' orders.* , fx,,'}
    assert BrokerSettings.from_env(env).routing.exclusive_addresses == ('orders.*', 'fx')
    assert BrokerSettings.from_env({}).routing.exclusive_addresses == ()


def test_a_member_reads_as_its_replica_and_consumer() -> None:
    assert consumer_of('replica-a|c7|sub|global|12') == ('replica-a', 'c7|sub|global')
    assert consumer_of('replica-a|c7') == ('replica-a', 'c7')
