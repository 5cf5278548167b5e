"""
A failed message's return reaches the store ahead of any later fetch of its subscription by the
replica that read the failure, so on a subscription that keeps its order through a redelivery
delay (exclusive, or with message groups) a message sent after the failure never overtakes it.

The window is narrow: the consumer's replica reads a store reply that asks for the next fetch
(credit came, or an announcement, while the last one was out) and, in the same turn, the
failure; the message sent next through the other replica is stored before that fetch runs.
It opens by chance, more often on a busy machine, so each test repeats fail-then-send for many
rounds on one queue. Real brokers, two replicas on one Redis.
"""

from collections.abc import Callable

import pytest
from amqpclient import connect, flush, nothing_more, receiver, send_all, settle
from processes import BrokerProcess
from proton import Delivery, Message

ROUNDS = 40
DELAY_MS = '50'


def _message(body: str, grouped: bool) -> Message:
    return Message(body=body, group_id='g' if grouped else None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize('order', ['exclusive', 'group'])
def test_a_message_sent_after_a_failure_never_overtakes_the_failed_one(
    start_broker: Callable[..., BrokerProcess], address: str, order: str
) -> None:
    env = {'SHOAL_REDELIVERY_DELAY_MS': DELAY_MS}
    if order == 'exclusive':
        env['SHOAL_EXCLUSIVE_ADDRESSES'] = address
    grouped = order == 'group'
    producing, consuming = start_broker(env=env), start_broker(env=env)
    consumer = connect(consuming.url)
    rcv = receiver(consumer, address, credit=20)
    conn = connect(producing.url)
    snd = send_all(conn, address, [])
    overtaken = []
    for r in range(ROUNDS):
        snd.send(_message(f'failed-{r}', grouped))
        first = rcv.receive(timeout=10)
        assert (first.body, first.delivery_count) == (f'failed-{r}', 0)
        settle(rcv, Delivery.MODIFIED, failed=True)
        flush(consumer)
        snd.send(_message(f'next-{r}', grouped))  # while the failed one waits out its delay
        got = []
        for _ in range(2):
            message = rcv.receive(timeout=10)
            got.append((message.body, message.delivery_count))
            rcv.accept()
        flush(consumer)
        if got != [(f'failed-{r}', 1), (f'next-{r}', 0)]:
            overtaken.append((r, got))
    assert overtaken == []
    assert nothing_more(rcv)
    consumer.close()
    conn.close()
