"""
`helm test` for Shoal: send one message to a queue through the broker Service and receive it back.

Runs in the broker image (python-qpid-proton is there). The URL and queue come from the
environment; the message carries a fresh id, so leftovers of earlier runs are received, accepted
and skipped rather than mistaken for this run's message. Exits non-zero on any failure.
"""

import os
import sys
import time
import uuid

from proton import Message
from proton.utils import BlockingConnection

TIMEOUT_SECONDS = 30
LEFTOVERS_ACCEPTED_AT_MOST = 1000


def main() -> int:
    url = os.environ['SHOAL_TEST_URL']
    queue = os.environ.get('SHOAL_TEST_QUEUE', 'shoal.helm-test')
    token = str(uuid.uuid4())
    conn = BlockingConnection(url, timeout=TIMEOUT_SECONDS)
    try:
        conn.create_sender(queue).send(Message(id=token, body=f'helm test {token}'))
        receiver = conn.create_receiver(queue)
        deadline = time.monotonic() + TIMEOUT_SECONDS
        for _ in range(LEFTOVERS_ACCEPTED_AT_MOST):
            message = receiver.receive(timeout=max(deadline - time.monotonic(), 0.1))
            receiver.accept()
            if message.id == token:
                sys.stdout.write(f'sent and received {token} on {queue} via {url}\n')
                return 0
        sys.stderr.write(f'{token} not received on {queue}\n')
        return 1
    finally:
        conn.close()


if __name__ == '__main__':
    sys.exit(main())
