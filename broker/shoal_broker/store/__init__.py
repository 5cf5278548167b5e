"""
The store: every Redis call the broker makes. This package is the only importer of redis-py,
so it imports redis-py first, here, without the OpenTelemetry metrics SDK.

redis-py 8.1's ``redis/observability/providers.py`` imports ``opentelemetry.sdk.metrics`` at
import time whenever the SDK is installed (it is wherever the broker's ``tracing`` extra is),
for a type annotation and a flag nothing reads. redis-py's own metrics stay off until an
application calls ``redis.observability.get_observability_instance().init(...)``, which the
broker never does, and that call imports the SDK again itself. The metrics SDK is 51 modules,
~2 MiB of every broker's RSS (docs/performance.md, "Idle memory"). So redis-py is imported with
that one module marked absent (``sys.modules[name] = None`` makes its import raise ImportError,
which redis-py catches), and the mark is lifted at once, so that tracing (``tracing/``) or
anything else imported later imports the SDK as usual. ``tests/amqp/test_idle_imports.py``
fails when a redis-py upgrade changes this.
"""

import sys

_METRICS_SDK = 'opentelemetry.sdk.metrics'


def _import_redis_without_metrics_sdk() -> None:
    if 'redis.observability.providers' in sys.modules or _METRICS_SDK in sys.modules:
        return  # redis-py or the SDK is in already: nothing to save, nothing to change
    sys.modules[_METRICS_SDK] = None  # type: ignore[assignment]
    try:
        import redis.asyncio  # noqa: F401
    finally:
        if _METRICS_SDK in sys.modules and sys.modules[_METRICS_SDK] is None:
            del sys.modules[_METRICS_SDK]


_import_redis_without_metrics_sdk()
