"""One producer's order on one address is kept for first deliveries (seed 004 §9)."""

import random

import pytest
from jmswire import JmsSource
from loadclient import ChaosConsumer, ChaosProducer, ChaosRun
from processes import BrokerProcess

COUNT = 5_000
QUEUE, TOPIC = 0, 1  # x-opt-jms-dest, as Qpid JMS writes it


def _first_deliveries_in_order(run: ChaosRun, address_of: dict[int, str]) -> dict[str, list[int]]:
    firsts: dict[str, list[int]] = {}
    for receipt in run.receipts:
        if receipt.delivery_count == 0:
            firsts.setdefault(address_of[receipt.body], []).append(receipt.body)
    return firsts


@pytest.mark.timeout(90)
def test_one_producers_order_on_a_queue_is_kept(broker: BrokerProcess, address: str) -> None:
    run = ChaosRun(
        [ChaosProducer([broker.url], address, range(COUNT))],
        [ChaosConsumer([broker.url], address, 'ordered', credit=100)],
        timeout=60,
    ).start()
    try:
        finished = run.wait(ChaosRun.delivered_all, timeout=50)
    finally:
        run.stop()
    assert finished, (len(run.accepted), len(run.received), run.log[-5:])
    assert len(run.accepted) == COUNT
    firsts = _first_deliveries_in_order(run, dict.fromkeys(range(COUNT), address))
    assert firsts[address] == list(range(COUNT))
    assert len(run.receipts) == COUNT


@pytest.mark.timeout(90)
def test_one_producers_order_through_the_anonymous_relay_is_kept_per_address(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    """Two queues and a topic, mixed at random in one producer's stream. The consumers are on the
    other replica, so the producer's replica learns each address from its first message (which
    waits for the store) while later ones queue up behind it."""
    targets = [(f'{address}-q0', QUEUE), (f'{address}-q1', QUEUE), (f'{address}-t', TOPIC)]
    mix = random.Random(4)
    route = {body: targets[mix.randrange(len(targets))] for body in range(COUNT)}
    consumers = [
        ChaosConsumer([second_broker.url], f'{address}-q0', 'q0', credit=100),
        ChaosConsumer([second_broker.url], f'{address}-q1', 'q1', credit=100),
        ChaosConsumer([second_broker.url], f'{address}-t', 't', [JmsSource('topic')], credit=100),
    ]
    producer = ChaosProducer([broker.url], None, range(COUNT), route=route.__getitem__)
    run = ChaosRun([producer], consumers, timeout=60).start()
    try:
        finished = run.wait(ChaosRun.delivered_all, timeout=50)
    finally:
        run.stop()
    assert finished, (len(run.accepted), len(run.received), run.rejected[:3])
    assert len(run.accepted) == COUNT
    address_of = {body: to for body, (to, _) in route.items()}
    firsts = _first_deliveries_in_order(run, address_of)
    for to, _ in targets:
        expected = [body for body in range(COUNT) if address_of[body] == to]
        assert firsts[to] == expected, to
    assert all(r.address == address_of[r.body] for r in run.receipts)
    assert len(run.receipts) == COUNT
