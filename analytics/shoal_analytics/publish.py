"""
Hand the summary to the operator: the HASH at ``keys.ANALYTICS_SUMMARY``, replaced atomically.

The operator judges staleness from ``generated_at_ms``; an older summary is overwritten, never
merged, so a flag that cleared disappears.
"""

from shoal_analytics import preflight
from shoal_analytics.errors import AnalyticsError
from shoal_broker.metrics.records import AnalyticsSummary
from shoal_broker.store import keys
from shoal_broker.store.connect import SyncRedis


def publish_summary(client: SyncRedis, summary: AnalyticsSummary) -> None:
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(keys.ANALYTICS_SUMMARY)
        for field, value in summary.to_fields().items():
            pipe.hset(keys.ANALYTICS_SUMMARY, field, value)
        pipe.execute()


def publish_to(redis_url: str, summary: AnalyticsSummary) -> None:
    """Publish over a connection of its own; a Redis gone since the analysis started is one line."""
    try:
        client = preflight.client(redis_url, decode_responses=True)
    except preflight.REDIS_FAILURES as exc:
        raise _not_published(redis_url, exc) from exc
    try:
        publish_summary(client, summary)
    except preflight.REDIS_FAILURES as exc:
        raise _not_published(redis_url, exc) from exc
    finally:
        client.close()


def _not_published(redis_url: str, exc: Exception) -> AnalyticsError:
    problem = preflight.unreachable(redis_url, exc)
    return AnalyticsError(f'the analysis is in the lake, not published: {problem}')
