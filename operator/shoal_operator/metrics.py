"""The operator's own Prometheus metrics (served on :9090/metrics by ``cli``)."""

from prometheus_client import Counter, Gauge

RECONCILES = Counter(
    'shoal_operator_reconciles_total', 'Reconciles by kind and result', ['kind', 'result']
)
PROVISIONED = Counter(
    'shoal_operator_provisioned_total', 'Writes to Redis by kind and outcome', ['kind', 'outcome']
)
FINALIZERS_RELEASED = Counter(
    'shoal_operator_finalizers_released_total',
    'Finalizers released without acting on Redis, by reason', ['reason'],
)  # fmt: skip
LAST_OBSERVATION = Gauge(
    'shoal_operator_last_observation_timestamp_seconds',
    'When live status was last sampled (a stuck operator stops moving it)',
)
MANAGED = Gauge('shoal_operator_resources', 'Resources seen, by kind', ['kind'])
OBSERVATION_SECONDS = Gauge(
    'shoal_operator_observation_duration_seconds',
    'How long the last observer pass took (it must stay well below the observe interval)',
)
