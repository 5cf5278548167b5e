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


@pytest.mark.parametrize(('spec', 'message'), [
    ({'delivery': {'maxDeliveryAttempts': 0}}, 'maxDeliveryAttempts must be an integer from 1'),
    ({'delivery': {'maxDeliveryAttempts': '3'}}, 'maxDeliveryAttempts must be an integer'),
    ({'delivery': {'deadLetterAddress': 'a b'}}, 'deadLetterAddress'),
    ({'retention': {'maxAgeSeconds': -1}}, 'maxAgeSeconds must be an integer from 1'),
    ({'retention': {'maxMessages': 3, 'overflow': 'Sideways'}}, 'overflow must be'),
    ({'retention': {'overflow': 'DropOldest'}}, 'overflow needs maxMessages'),
])  # fmt: skip
def test_a_policy_the_crd_would_refuse_is_an_invalid_spec(spec: dict[str, Any], message: str
                                                          ) -> None:  # fmt: skip
    with pytest.raises(InvalidSpec, match=message):
        Queue.from_body(queue(**spec))
