"""Two broker processes on one Redis serve one queue as a single queue."""

import collections

import pytest
from amqpclient import connect, nothing_more, receive_all, receiver, sender
from loadclient import CompetingRun
from processes import BrokerProcess
from proton import Message


@pytest.mark.timeout(150)
def test_ten_thousand_messages_to_four_consumers_on_two_replicas_each_exactly_once(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    consumers = [broker.url, second_broker.url, broker.url, second_broker.url]
    run = CompetingRun(broker.url, consumers, address, count=10_000, timeout=120).run()
    assert not run.timed_out, f'sent {run.sent}, confirmed {run.confirmed}'
    everything = [body for got in run.received.values() for body in got]
    duplicates = [b for b, n in collections.Counter(everything).items() if n > 1]
    assert duplicates == []
    assert sorted(everything) == list(range(10_000))
    assert all(run.received[i] for i in range(4)), 'every consumer took part'
    on_a = len(run.received[0]) + len(run.received[2])
    on_b = len(run.received[1]) + len(run.received[3])
    assert on_a > 0
    assert on_b > 0
    for url in (broker.url, second_broker.url):
        conn = connect(url)
        assert nothing_more(receiver(conn, address, credit=10))
        conn.close()


def test_a_message_released_on_one_replica_is_delivered_by_the_other(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    here = connect(broker.url)
    there = connect(second_broker.url)
    sender(here, address).send(Message(body='hot potato'))
    first = receiver(here, address, credit=1)
    first.receive(timeout=5)
    other = receiver(there, address, credit=1)  # attached while the message is held by replica a
    first.close()  # unsettled at close: returned with delivery-count + 1
    again = receive_all(other, 1)[0]
    assert (again.body, again.delivery_count) == ('hot potato', 1)
    here.close()
    there.close()
