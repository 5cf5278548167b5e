"""
The knobs of one analysis, with the defaults the tests and the chart rely on.

Thresholds carry minimum sample counts: a ratio or a percentile over a handful of messages is
noise, and an operator acting on noise scales clusters for nothing (reference/spark.md §8).
"""

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnalysisParams:
    window_seconds: int = 60
    """Length of the windows rates, backlog trends and per-replica load are computed over."""
    lookback_minutes: int = 60
    """How much history, ending at the newest record, one analysis reads."""
    capacity_per_replica: float = 10_000.0
    """Transfers (enqueued + delivered messages) per second one replica sustains. The default is
    a deliberately low starting point, about a quarter of a core by the model in docs/capacity.md
    (the analytics job's capacity per replica); measure your own nodes and pass it."""
    target_utilisation: float = 0.7
    """The fraction of capacity the recommendation plans for, leaving headroom for bursts."""
    current_replicas: int | None = None
    """Replicas running now; by default the replicas seen in the newest complete window (with
    no complete window yet, the replicas seen in the lookback)."""

    min_deliveries: int = 200
    """Deliveries over the lookback before redelivery, latency and fairness flags may fire."""
    min_enqueued: int = 200
    """Enqueued messages over the lookback before the expiry flag may fire."""
    redelivery_ratio: float = 0.05
    expiry_ratio: float = 0.01
    latency_slo_ms: float = 1000.0
    """p99 delivery latency above this flags a slow consumer."""
    backlog_min: int = 100
    """A backlog smaller than this is never called growing."""
    backlog_growing_fraction: float = 0.6
    """Fraction of the record intervals from the first backlog sample to the newest in which
    it must have grown (an interval the broker wrote no record for held the backlog still)."""
    min_backlog_samples: int = 3
    """Record intervals the backlog samples must span before a trend is judged (three)."""
    starved_fraction: float = 0.1
    """A replica's consumers are starved below this fraction of the mean per-consumer deliveries."""
    hot_share_factor: float = 1.5
    """A replica is hot when its share of the cluster's transfers exceeds this times 1/replicas."""
    min_dead_letters: int = 1
    """Dead-lettered messages over the lookback that flag an entity (each one is a message its
    consumers could not process)."""
    share_skew_ratio: float = 1.5
    """A queue or subscription served by several replicas is flagged when the busiest replica's
    share of its deliveries is at least this times the least busy one's."""
    min_transfers: int = 1000
    """Cluster transfers over the lookback before the hot-replica flag may fire."""

    def __post_init__(self) -> None:
        if self.window_seconds <= 0 or self.lookback_minutes <= 0:
            raise ValueError('window and lookback must be positive')
        if self.capacity_per_replica <= 0:
            raise ValueError('capacity per replica must be positive')
        if not 0 < self.target_utilisation <= 1:
            raise ValueError('target utilisation must be in (0, 1]')
        if self.current_replicas is not None and self.current_replicas < 0:
            raise ValueError('current replicas must not be negative')
