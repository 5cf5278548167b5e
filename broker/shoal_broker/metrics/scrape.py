"""
Gauges and counters whose values live elsewhere (the broker's state, the store's plain ints),
read when Prometheus scrapes, so they are never stale and their owners import no
prometheus_client.
"""

from collections.abc import Callable, Iterable

from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shoal_broker.metrics.labels import folded

Gauges = Callable[[], Iterable[tuple[str, str, list[str], list[tuple[list[str], float]]]]]
"""Yields (name, help, label names, [(label values, value), ...]) at scrape time."""


class ScrapeTimeGauges(Collector):
    """Gauges read from the broker's own state when Prometheus scrapes (never stale)."""

    def __init__(self, source: Gauges) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        for name, help_text, label_names, samples in self._source():
            family = GaugeMetricFamily(name, help_text, labels=label_names)
            totals: dict[tuple[str, ...], float] = {}
            for values, value in samples:
                key = folded(label_names, values)
                totals[key] = totals.get(key, 0.0) + value
            for key, value in totals.items():
                family.add_metric(list(key), value)
            yield family


def register_gauges(source: Gauges) -> ScrapeTimeGauges:
    collector = ScrapeTimeGauges(source)
    REGISTRY.register(collector)
    return collector


Counts = Callable[[], Iterable[tuple[str, str, list[str], list[tuple[list[str], float]]]]]
"""Yields (name without _total, help, label names, [(label values, count), ...]) at scrape time."""


class ScrapeTimeCounters(Collector):
    """Counters kept as plain ints by code that must not import prometheus_client (the store's
    modules are imported by the operator too), read when Prometheus scrapes."""

    def __init__(self, source: Counts) -> None:
        self._source = source

    def collect(self) -> Iterable[CounterMetricFamily]:
        for name, help_text, label_names, samples in self._source():
            family = CounterMetricFamily(name, help_text, labels=label_names)
            for values, value in samples:
                family.add_metric(values, value)
            yield family


def register_counters(source: Counts) -> ScrapeTimeCounters:
    collector = ScrapeTimeCounters(source)
    REGISTRY.register(collector)
    return collector
