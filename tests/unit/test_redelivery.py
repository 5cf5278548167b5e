"""The redelivery delay's rule: delay * multiplier ** (count - 1), capped, from the entity's
policy with the broker-wide settings for what it leaves unset."""

import pytest

from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.routing.redelivery import CEILING_MS, OFF, Backoff, Backoffs, backoff_of
from shoal_broker.settings import BrokerSettings, RoutingSettings


def test_the_wait_doubles_with_each_failed_attempt_up_to_the_maximum() -> None:
    rule = Backoff(200, 2.0, 1000)
    assert [rule.wait_ms(n) for n in (0, 1, 2, 3, 4, 5)] == [200, 200, 400, 800, 1000, 1000]


def test_no_wait_passes_a_day_whatever_the_count() -> None:
    assert Backoff(1000, 100.0).wait_ms(10**9) == CEILING_MS
    assert Backoff(1000, 100.0, 10 * CEILING_MS).wait_ms(50) == CEILING_MS


def test_off_means_no_wait() -> None:
    assert OFF.wait_ms(7) == 0
    assert backoff_of(EntityPolicy(), RoutingSettings()) == OFF


def test_the_policy_wins_and_the_settings_fill_in() -> None:
    defaults = RoutingSettings(redelivery_delay_ms=50, redelivery_multiplier=3.0,
                               max_redelivery_delay_ms=900)  # fmt: skip
    assert backoff_of(EntityPolicy(), defaults) == Backoff(50, 3.0, 900)
    assert backoff_of(EntityPolicy(redelivery_delay_ms=10), defaults) == Backoff(10, 3.0, 900)
    assert backoff_of(EntityPolicy(redelivery_delay_ms=0), defaults) == OFF
    declared = EntityPolicy(redelivery_delay_ms=200, redelivery_multiplier=2.0)
    rules = Backoffs.of({'queue:a': declared, 'queue:b': EntityPolicy()}, defaults)
    assert rules.get('queue:a') == Backoff(200, 2.0, 900)
    assert rules.get('queue:b') == rules.get('subscription:x') == Backoff(50, 3.0, 900)


def test_the_policy_round_trips_through_its_json() -> None:
    policy = EntityPolicy(redelivery_delay_ms=200, redelivery_multiplier=1.5,
                          max_redelivery_delay_ms=5000)  # fmt: skip
    assert EntityPolicy.from_json(policy.to_json()) == policy


def test_the_settings_come_from_the_environment_and_bad_ones_are_refused() -> None:
    env = {'SHOAL_REDELIVERY_DELAY_MS': '200', 'SHOAL_REDELIVERY_MULTIPLIER': '2',
           'SHOAL_MAX_REDELIVERY_DELAY_MS': '10000'}  # fmt: skip
    routing = BrokerSettings.from_env(env).routing
    assert (routing.redelivery_delay_ms, routing.redelivery_multiplier,
            routing.max_redelivery_delay_ms) == (200, 2.0, 10000)  # fmt: skip
    with pytest.raises(ValueError, match='multiplier'):
        BrokerSettings.from_env({'SHOAL_REDELIVERY_MULTIPLIER': '0.5'})
    with pytest.raises(ValueError, match='0 ms or more'):
        BrokerSettings.from_env({'SHOAL_REDELIVERY_DELAY_MS': '-1'})
