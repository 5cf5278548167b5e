"""
Synthetic metric records with planted problems, for the acceptance tests and the benchmark.

Rows have exactly the raw table's columns (``rows.RAW_COLUMNS``), generated with numpy so a
million cost seconds. Healthy traffic: Poisson rates per entity, replicas loaded evenly (their
consumers in proportion), latencies mostly under 50 ms, small steady backlogs. Each plant breaks
one of those on one entity or replica, as the analysis should then report it.
"""

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shoal_analytics.rows import RAW_COLUMNS
from shoal_broker.metrics.records import COUNTS, LATENCY_BOUNDS, sketch_index

PLANTS = ('growing_backlog', 'starved_consumer', 'redelivery_storm', 'slow_consumer',
          'hot_replica', 'expiry_storm')  # fmt: skip
HEALTHY_LATENCY = (0.35, 0.3, 0.15, 0.15, 0.04, 0.009, 0.001, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
SLOW_LATENCY = (0.05, 0.05, 0.05, 0.1, 0.1, 0.15, 0.2, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0)
"""Probabilities of a wait in each of ``LATENCY_BOUNDS``' ranges (and beyond the last)."""
_EDGES = (0.0005, *LATENCY_BOUNDS, 7200.0)
WAIT_OF_RANGE = tuple(sketch_index((low * high) ** 0.5) for low, high in itertools.pairwise(_EDGES))
"""The sketch bucket of the waits drawn in each range: its geometric middle."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Synthetic:
    entities: int = 20
    replicas: int = 3
    intervals: int = 60
    interval_ms: int = 10_000
    start_ms: int = 1_800_000_000_000
    plants: Sequence[str] = PLANTS
    seed: int = 7

    def entity(self, index: int) -> str:
        return f'{"orders" if index % 2 else "events"}.{index}'

    def replica(self, index: int) -> str:
        return f'shoal-{index}'

    @property
    def planted(self) -> dict[str, str]:
        """Which entity (or replica) carries each plant: the answer the analysis must find."""
        where = {
            'growing_backlog': self.entity(0), 'starved_consumer': self.entity(1),
            'redelivery_storm': self.entity(2), 'slow_consumer': self.entity(3),
            'expiry_storm': self.entity(4), 'hot_replica': self.replica(0),
        }  # fmt: skip
        return {plant: where[plant] for plant in self.plants}

    @property
    def starved_replica(self) -> str:
        return self.replica(self.replicas - 1)


def generate(spec: Synthetic) -> pa.Table:
    """All records of ``spec``: intervals x replicas x entities rows."""
    rng = np.random.default_rng(spec.seed)
    grid = np.meshgrid(
        np.arange(spec.intervals), np.arange(spec.replicas), np.arange(spec.entities), indexing='ij'
    )
    t, r, e = (axis.ravel() for axis in grid)
    rows = t.size
    weight = np.ones(spec.replicas)
    if 'hot_replica' in spec.plants:
        weight[0] = 3.0
    share = (weight / weight.sum())[r]
    base = 40 + 160 * rng.random(spec.entities)  # messages per interval, cluster-wide
    enqueued = rng.poisson(base[e] * share)
    delivered = rng.poisson(base[e] * share)
    consumers = np.maximum(1, np.rint(2 * weight[r])).astype(np.int64)
    released = np.zeros(rows, dtype=np.int64)
    expired = np.zeros(rows, dtype=np.int64)
    backlog = rng.poisson(20, size=rows)
    probabilities = np.tile(HEALTHY_LATENCY, (rows, 1))

    def planted(name: str, entity: int) -> 'np.ndarray[tuple[int], np.dtype[np.bool_]]':
        return (e == entity) if name in spec.plants else np.zeros(rows, dtype=bool)

    grows = planted('growing_backlog', 0)
    delivered[grows] = (0.7 * enqueued[grows]).astype(np.int64)
    backlog[grows] = 200 + 40 * t[grows] + rng.integers(0, 10, size=int(grows.sum()))
    starved = planted('starved_consumer', 1) & (r == spec.replicas - 1)
    delivered[starved] = 0
    storm = planted('redelivery_storm', 2)
    released[storm] = rng.binomial(delivered[storm], 0.2)
    probabilities[planted('slow_consumer', 3)] = SLOW_LATENCY
    expiring = planted('expiry_storm', 4)
    expired[expiring] = rng.binomial(enqueued[expiring], 0.05)

    accepted = delivered - released
    buckets = _multinomial(rng, accepted, probabilities)
    counts = {name: np.zeros(rows, dtype=np.int64) for name in COUNTS}
    counts.update(enqueued=enqueued, delivered=delivered, accepted=accepted, released=released,
                  expired=expired)  # fmt: skip
    entity_names = np.array([spec.entity(i) for i in range(spec.entities)])
    replica_names = np.array([spec.replica(i) for i in range(spec.replicas)])
    ts = spec.start_ms + (t + 1) * spec.interval_ms + r * 37  # replicas tick out of phase
    columns: dict[str, pa.Array] = {
        'stream_id': pa.array([f'{x}-{i}' for i, x in enumerate(ts)]),
        'ts_ms': pa.array(ts, pa.int64()),
        'interval_ms': pa.array(np.full(rows, spec.interval_ms), pa.int64()),
        'replica': pa.array(replica_names[r]),
        'address': pa.array(entity_names[e]),
        'subscription': pa.array(np.full(rows, 'queue')),
        **{name: pa.array(values, pa.int64()) for name, values in counts.items()},
        'consumers': pa.array(consumers, pa.int64()),
        'backlog': pa.array(backlog, pa.int64()),
        'latency_buckets': pa.nulls(rows, pa.list_(pa.int64())),  # schema 3: a sketch
        'latency_sketch': pa.array(
            [[(WAIT_OF_RANGE[i], int(n)) for i, n in enumerate(row) if n] for row in buckets],
            pa.map_(pa.int32(), pa.int64()),
        ),
        'cr_namespace': pa.array(np.full(rows, '')),
        'cr_name': pa.array(np.full(rows, '')),
        'error': pa.nulls(rows, pa.string()),
    }
    return pa.table([columns[name] for name in RAW_COLUMNS], names=list(RAW_COLUMNS))


def _multinomial(
    rng: np.random.Generator, counts: 'np.ndarray[tuple[int], np.dtype[np.int64]]',
    probabilities: 'np.ndarray[tuple[int, int], np.dtype[np.float64]]',
) -> 'np.ndarray[tuple[int, int], np.dtype[np.int64]]':  # fmt: skip
    """Row-wise multinomial draws, vectorised as successive binomials (exact, and fast)."""
    out = np.zeros(probabilities.shape, dtype=np.int64)
    left = counts.copy()
    mass = np.ones(len(counts))
    for column in range(probabilities.shape[1] - 1):
        p = np.clip(probabilities[:, column] / np.maximum(mass, 1e-12), 0, 1)
        out[:, column] = rng.binomial(left, p)
        left -= out[:, column]
        mass -= probabilities[:, column]
    out[:, -1] = left
    return out


def write_raw(spec: Synthetic, raw_dir: Path) -> int:
    """Write ``spec``'s records as Parquet into a lake's raw directory; returns the row count."""
    table = generate(spec)
    raw_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, raw_dir / f'synthetic-{spec.seed}.parquet')
    rows: int = table.num_rows
    return rows


assert len(HEALTHY_LATENCY) == len(SLOW_LATENCY) == len(LATENCY_BOUNDS) + 1
