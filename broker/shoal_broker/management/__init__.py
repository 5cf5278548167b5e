"""
The management HTTP API: what a cluster holds, and the operations that fix it (browse, purge,
move, retry, delete, pause, close a connection), on every replica's HTTP port.

Cluster-wide: it reads and writes Redis (``store/management.py``), so any replica answers for
all. Authentication and permissions are the AMQP listener's (the users file; ``browse`` for
reads, ``manage`` for writes), and every write is an audit line and a counted metric.
"""
