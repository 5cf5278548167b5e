"""
Reading the shared metrics stream (``shoal:metrics``) in tests: every test's brokers on one
store append to it, and some store tests append entries of their own without a schema, so a test
parses only the entries it picked by their raw fields, never the whole stream.
"""

from collections.abc import Callable, Mapping

import redis

from shoal_broker.metrics.records import MetricRecord

METRICS = 'shoal:metrics'


def metric_records(redis_url: str, pick: Callable[[Mapping[str, str]], bool]) -> list[MetricRecord]:
    """The stream's records whose raw fields ``pick`` keeps, parsed, oldest first."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        entries = client.xrange(METRICS)
    finally:
        client.close()
    return [MetricRecord.from_fields(fields) for _, fields in entries if pick(fields)]
