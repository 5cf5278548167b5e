"""
`helm test` for Shoal: send one message to a queue through the broker Service and receive it back.

Runs in the broker image (python-qpid-proton is there). The URL, queue and credentials come from
the environment: with SHOAL_TEST_USERNAME and SHOAL_TEST_PASSWORD it logs in with SASL PLAIN,
without them anonymously. The message carries a fresh id, so leftovers of earlier runs are
received, accepted and skipped rather than mistaken for this run's message. Exits non-zero on any
failure.
"""

import os
import sys
import time
import uuid

from proton import Message
from proton.utils import BlockingConnection

TIMEOUT_SECONDS = 30
LEFTOVERS_ACCEPTED_AT_MOST = 1000


def credentials(url: str) -> dict[str, object]:
    """Connection options logging in as SHOAL_TEST_USERNAME with PLAIN; none for ANONYMOUS."""
    user = os.environ.get('SHOAL_TEST_USERNAME')
    if not user:
        return {}
    return {
        'user': user,
        'password': os.environ.get('SHOAL_TEST_PASSWORD', ''),
        'allowed_mechs': 'PLAIN',
        # proton refuses PLAIN without TLS unless told; amqp:// stays inside the cluster network
        'allow_insecure_mechs': not url.startswith('amqps://'),
    }


def main() -> int:
    url = os.environ['SHOAL_TEST_URL']
    queue = os.environ.get('SHOAL_TEST_QUEUE', 'shoal.helm-test')
    token = str(uuid.uuid4())
    conn = BlockingConnection(url, timeout=TIMEOUT_SECONDS, **credentials(url))
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
