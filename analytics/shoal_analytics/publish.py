"""
Hand the summary to the operator: the HASH at ``ANALYTICS_SUMMARY_KEY``, replaced atomically.

The operator judges staleness from ``generated_at_ms``; an older summary is overwritten, never
merged, so a flag that cleared disappears.
"""

import redis

from shoal_broker.metrics.records import ANALYTICS_SUMMARY_KEY, AnalyticsSummary


def publish_summary(client: redis.Redis, summary: AnalyticsSummary) -> None:
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(ANALYTICS_SUMMARY_KEY)
        for field, value in summary.to_fields().items():
            pipe.hset(ANALYTICS_SUMMARY_KEY, field, value)
        pipe.execute()
