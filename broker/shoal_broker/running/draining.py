"""
The first step of a stop: let what is under way finish before connections close.

A replica asked to stop (SIGTERM: a scale-down or a rollout) first stops taking anything new:
``/readyz`` turns 503 at once, the listeners close, no producer gets more credit and no consumer
is dealt another message. Producers are asked to give back the credit they hold (a drain). Each
connection is then closed with ``amqp:connection:forced`` as soon as it owes nothing: every send
it made is stored and accepted, its producers hold no credit, and every delivery out at its
consumers is settled. A client that fails over so has no send in doubt to repeat and no message
to see again: the move costs it a reconnect. A consumer-only connection typically goes at once,
a producer's after one round trip. All of it within ``SHOAL_CONNECTION_DRAIN_SECONDS``; what
is left then is handled by the close itself (deliveries go back to the store with
delivery-count + 1, sends not yet answered are in doubt for their producers, as with any lost
connection).

No ``amqp:connection:redirect`` to another replica: a pod address is the wrong place to send a
client (it bypasses the Service's balancing, and that pod may be the next to go in a scale-down
of several), and Qpid JMS's ``failover:`` reconnects to the Service anyway.
"""

import asyncio
import logging
import time

from shoal_broker.amqp.broker import Broker

logger = logging.getLogger(__name__)

CLOSE_CONDITION = 'amqp:connection:forced'
"""What Qpid JMS fails over on (to the next URI of its ``failover:`` list: the Service)."""
CLOSE_DESCRIPTION = 'broker is shutting down'
POLL_SECONDS = 0.01
"""How often the owed work is counted while draining: a few counters per link, cheap."""


async def drain(broker: Broker, bound_seconds: float) -> tuple[int, int, int]:
    """Quiesce ``broker`` and close each connection once it owes nothing, for at most
    ``bound_seconds``; return what is left then (connections, sends, deliveries)."""
    broker.quiesce()
    started = time.monotonic()
    deadline = started + bound_seconds
    while True:
        left = broker.close_settled(CLOSE_CONDITION, CLOSE_DESCRIPTION)
        if not left[0] or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_SECONDS)
    took = time.monotonic() - started
    if left[0]:
        logger.warning(
            'drained for %.1f s: %d connections still owe %d sends and %d deliveries; the '
            'deliveries are returned, the sends are in doubt for their producers', took, *left,
        )  # fmt: skip
    else:
        logger.info('drained in %.2f s: every connection closed with nothing under way', took)
    return left
