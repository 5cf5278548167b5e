"""Queue and SharedSubscription ``delivery{}``/``retention{}`` parsed into the broker's
``EntityPolicy`` (the operator's model and the declaration it provisions)."""

from typing import Any

import pytest

from shoal_broker.routing.policies import NO_POLICY, EntityPolicy
from shoal_broker.settings import Overflow
from shoal_operator import provisioning
from shoal_operator.models import InvalidSpec, Queue, SharedSubscription


def queue(**spec: Any) -> dict[str, Any]:
    return {'kind': 'Queue', 'metadata': {'name': 'orders', 'namespace': 'shop'},
            'spec': {'clusterRef': {'name': 'shoal'}, **spec}}  # fmt: skip


def sub(**spec: Any) -> dict[str, Any]:
    return {'kind': 'SharedSubscription', 'metadata': {'name': 'audit', 'namespace': 'shop'},
            'spec': {'clusterRef': {'name': 'shoal'}, 'topic': 'prices',
                     'subscriptionName': 'audit', **spec}}  # fmt: skip


def test_without_delivery_or_retention_the_broker_wide_settings_apply() -> None:
    assert Queue.from_body(queue()).policy == NO_POLICY
    assert SharedSubscription.from_body(sub()).policy == NO_POLICY


def test_a_queue_carries_its_delivery_and_retention() -> None:
    parsed = Queue.from_body(queue(
        delivery={'maxDeliveryAttempts': 4, 'deadLetterAddress': 'orders-dlq'},
        retention={'maxAgeSeconds': 60, 'maxMessages': 3, 'overflow': 'DropOldest'}))  # fmt: skip
    assert parsed.policy == EntityPolicy(4, 'orders-dlq', 60, 3, Overflow.DROP_OLDEST)
    limited = Queue.from_body(queue(retention={'maxMessages': 3}))
    assert limited.policy == EntityPolicy(max_messages=3, overflow=Overflow.REJECT_PUBLISH)


def test_a_subscription_declaration_carries_its_policy_and_no_backlog_limit() -> None:
    retention = {'maxAgeSeconds': 30, 'maxMessages': 3}  # maxMessages is for queues only
    parsed = SharedSubscription.from_body(sub(delivery={'maxDeliveryAttempts': 2},
                                              retention=retention))  # fmt: skip
    declaration = provisioning.declaration(parsed)
    assert declaration.policy == EntityPolicy(max_delivery_attempts=2, max_age_seconds=30)


def test_a_redelivery_delay_is_carried_in_the_broker_vocabulary() -> None:
    parsed = Queue.from_body(queue(delivery={'redeliveryDelay': 200, 'redeliveryMultiplier': 2,
                                             'maxRedeliveryDelay': 5000}))  # fmt: skip
    assert parsed.policy == EntityPolicy(
        redelivery_delay_ms=200, redelivery_multiplier=2.0, max_redelivery_delay_ms=5000
    )
    declaration = provisioning.declaration(SharedSubscription.from_body(sub(
        delivery={'redeliveryDelay': 0})))  # fmt: skip
    assert declaration.policy == EntityPolicy(redelivery_delay_ms=0)


def test_duplicate_detection_is_carried_and_a_subscription_names_its_topic() -> None:
    parsed = Queue.from_body(queue(duplicateDetection={'enabled': True, 'windowSeconds': 30}))
    assert parsed.policy == EntityPolicy(duplicate_detection=True, duplicate_window_seconds=30)
    off = Queue.from_body(queue(duplicateDetection={'enabled': False}))
    assert off.policy == EntityPolicy(duplicate_detection=False)
    declaration = provisioning.declaration(SharedSubscription.from_body(sub(
        duplicateDetection={'enabled': True, 'idProperty': '_AMQ_DUPL_ID'})))  # fmt: skip
    assert declaration.policy == EntityPolicy(
        duplicate_detection=True, duplicate_id_property='_AMQ_DUPL_ID', topic='prices'
    )


def test_a_last_value_queue_is_carried() -> None:
    parsed = Queue.from_body(queue(lastValue={'enabled': True, 'property': 'device'}))
    assert parsed.policy == EntityPolicy(last_value=True, last_value_property='device')
    off = Queue.from_body(queue(lastValue={'enabled': False}))
    assert off.policy == EntityPolicy(last_value=False)
    assert Queue.from_body(queue()).policy == EntityPolicy()
    declaration = provisioning.declaration(SharedSubscription.from_body(sub(
        lastValue={'enabled': True})))  # fmt: skip
    assert declaration.policy == EntityPolicy()  # queues only


def test_exclusive_is_carried_and_unset_leaves_it_to_the_broker_patterns() -> None:
    assert Queue.from_body(queue(delivery={'exclusive': True})).policy == EntityPolicy(
        exclusive=True
    )
    declared = provisioning.declaration(SharedSubscription.from_body(sub(
        delivery={'exclusive': False})))  # fmt: skip
    assert declared.policy == EntityPolicy(exclusive=False)
    assert Queue.from_body(queue(delivery={'maxDeliveryAttempts': 2})).policy.exclusive is None
    with pytest.raises(InvalidSpec, match='maxConsumers of at least 2'):
        SharedSubscription.from_body(sub(delivery={'exclusive': True}, maxConsumers=1))


def test_group_rebalance_is_carried_to_the_policy_and_checked() -> None:
    assert Queue.from_body(queue(delivery={'groupRebalance': True})).policy == EntityPolicy(
        group_rebalance=True
    )
    declared = provisioning.declaration(SharedSubscription.from_body(sub(
        delivery={'groupRebalance': False})))  # fmt: skip
    assert declared.policy == EntityPolicy(group_rebalance=False)
    assert Queue.from_body(queue()).policy.group_rebalance is None
    with pytest.raises(InvalidSpec, match='groupRebalance must be true or false'):
        Queue.from_body(queue(delivery={'groupRebalance': 1}))


@pytest.mark.parametrize(('spec', 'message'), [
    ({'delivery': {'maxDeliveryAttempts': 0}}, 'maxDeliveryAttempts must be an integer from 1'),
    ({'delivery': {'maxDeliveryAttempts': '3'}}, 'maxDeliveryAttempts must be an integer'),
    ({'delivery': {'deadLetterAddress': 'a b'}}, 'deadLetterAddress'),
    ({'retention': {'maxAgeSeconds': -1}}, 'maxAgeSeconds must be an integer from 1'),
    ({'retention': {'maxMessages': 3, 'overflow': 'Sideways'}}, 'overflow must be'),
    ({'retention': {'overflow': 'DropOldest'}}, 'overflow needs maxMessages'),
    ({'duplicateDetection': {'window': 3}}, 'duplicateDetection.enabled must be true or false'),
    ({'duplicateDetection': {'enabled': False, 'window': 3}}, 'need enabled: true'),
    ({'duplicateDetection': {'enabled': True, 'window': 0}}, 'window must be an integer from 1'),
    ({'duplicateDetection': {'enabled': True, 'idProperty': 'a b'}}, 'idProperty'),
    ({'delivery': {'redeliveryDelay': -5}}, 'redeliveryDelay must be an integer from 0'),
    ({'delivery': {'redeliveryDelay': '200ms'}}, 'redeliveryDelay must be an integer'),
    ({'delivery': {'redeliveryMultiplier': 0.5}}, 'redeliveryMultiplier must be from 1'),
    ({'delivery': {'redeliveryMultiplier': True}}, 'redeliveryMultiplier must be a number'),
    ({'delivery': {'redeliveryDelay': 900, 'maxRedeliveryDelay': 100}}, 'at least redeliveryDelay'),
    ({'lastValue': {'property': 'k'}}, 'lastValue.enabled must be true or false'),
    ({'lastValue': {'enabled': False, 'property': 'k'}}, 'property needs enabled: true'),
    ({'lastValue': {'enabled': True, 'property': 'a b'}}, 'lastValue.property'),
    ({'delivery': {'exclusive': 'yes'}}, 'exclusive must be true or false'),
])  # fmt: skip
def test_a_policy_the_crd_would_refuse_is_an_invalid_spec(spec: dict[str, Any], message: str
                                                          ) -> None:  # fmt: skip
    with pytest.raises(InvalidSpec, match=message):
        Queue.from_body(queue(**spec))
