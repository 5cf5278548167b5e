"""``BrokerSettings.from_env`` and the command line over it (``cli.settings_from``)."""

import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from shoal_broker import cli, settings
from shoal_broker.settings import (
    AddressKind,
    BrokerSettings,
    ClientAuth,
    Durability,
    LogFormat,
    Overflow,
)

# variable -> (value set, path of the field, expected value of that exact type)
EVERY_VARIABLE: dict[str, tuple[str, str, Any]] = {
    'SHOAL_LISTEN': ('0.0.0.0:5673', 'amqp.listen', '0.0.0.0:5673'),
    'SHOAL_HTTP': ('0.0.0.0:9090', 'http', '0.0.0.0:9090'),
    'SHOAL_REDIS_URL': ('redis://r:6379/2', 'store.redis_url', 'redis://r:6379/2'),
    'SHOAL_DATA_DIR': ('/var/lib/shoal', 'store.data_dir', '/var/lib/shoal'),
    'SHOAL_REPLICA_ID': ('pod-7', 'replica_id', 'pod-7'),
    'SHOAL_LOG_FORMAT': ('json', 'log_format', LogFormat.JSON),
    'SHOAL_LOG_LEVEL': ('DEBUG', 'log_level', 'DEBUG'),
    'SHOAL_IDLE_TIMEOUT_SECONDS': ('2.5', 'amqp.idle_timeout_seconds', 2.5),
    'SHOAL_MAX_FRAME_SIZE': ('4096', 'amqp.max_frame_size', 4096),
    'SHOAL_MAX_MESSAGE_SIZE': ('123456', 'amqp.max_message_size', 123456),
    'SHOAL_PRODUCER_CREDIT': ('17', 'amqp.producer_credit', 17),
    'SHOAL_AUTO_CREATE_QUEUES': ('false', 'routing.auto_create_queues', False),
    'SHOAL_AUTO_CREATE_TOPICS': ('no', 'routing.auto_create_topics', False),
    'SHOAL_DEFAULT_ADDRESS_KIND': ('topic', 'routing.default_address_kind', AddressKind.TOPIC),
    'SHOAL_MAX_DELIVERY_ATTEMPTS': ('0', 'routing.max_delivery_attempts', 0),
    'SHOAL_DEAD_LETTER_ADDRESS': ('dead', 'routing.dead_letter_address', 'dead'),
    'SHOAL_EXPIRY_ADDRESS': ('expired', 'routing.expiry_address', 'expired'),
    'SHOAL_REDELIVERY_DELAY_MS': ('200', 'routing.redelivery_delay_ms', 200),
    'SHOAL_REDELIVERY_MULTIPLIER': ('2.5', 'routing.redelivery_multiplier', 2.5),
    'SHOAL_MAX_REDELIVERY_DELAY_MS': ('60000', 'routing.max_redelivery_delay_ms', 60000),
    'SHOAL_MAX_CONSUMERS_PER_SUBSCRIPTION': (
        '3',
        'routing.max_consumers_per_subscription',
        3,
    ),
    'SHOAL_DECLARED_SUBSCRIPTIONS_ONLY': ('true', 'routing.declared_subscriptions_only', True),
    'SHOAL_HANDOVER': ('false', 'routing.handover', False),
    'SHOAL_HANDOVER_HOLD_SECONDS': ('2.5', 'routing.handover_hold_seconds', 2.5),
    'SHOAL_DELIVER_AHEAD': ('false', 'routing.deliver_ahead', False),
    'SHOAL_EXCLUSIVE_ADDRESSES': ('orders.*,fx', 'routing.exclusive_addresses', ('orders.*', 'fx')),
    'SHOAL_TRIM_INTERVAL_SECONDS': ('0.5', 'store.trim_interval_seconds', 0.5),
    'SHOAL_LEASE_SECONDS': ('2', 'store.lease_seconds', 2.0),
    'SHOAL_METRICS_INTERVAL_SECONDS': ('1.5', 'store.metrics_interval_seconds', 1.5),
    'SHOAL_METRICS_STREAM_LENGTH': ('1000', 'store.metrics_stream_length', 1000),
    'SHOAL_METRICS_HEARTBEAT_SECONDS': ('45', 'store.metrics_heartbeat_seconds', 45.0),
    'SHOAL_TRACING': ('true', 'tracing.enabled', True),
    'SHOAL_TRACING_SAMPLE_RATIO': ('0.25', 'tracing.sample_ratio', 0.25),
    'SHOAL_BACKLOG_REFRESH_SECONDS': ('2.5', 'store.backlog_refresh_seconds', 2.5),
    'SHOAL_DURABILITY': ('fsync', 'store.durability', Durability.FSYNC),
    'SHOAL_REPLICATION_TIMEOUT_MS': ('250', 'store.replication_timeout_ms', 250),
    'SHOAL_BIG_MESSAGE_BYTES': ('65536', 'store.big_message_bytes', 65536),
    'SHOAL_SHUTDOWN_GRACE_SECONDS': ('3', 'shutdown_grace_seconds', 3.0),
    'SHOAL_CONNECTION_DRAIN_SECONDS': ('0.5', 'connection_drain_seconds', 0.5),
    # security and limits (docs/security.md)
    'SHOAL_ALLOW_ANONYMOUS': ('false', 'security.allow_anonymous', False),
    'SHOAL_USERS_FILE': ('/etc/shoal/users.json', 'security.users_file', '/etc/shoal/users.json'),
    'SHOAL_MANAGEMENT_CREDENTIALS_DIR': (
        '/etc/shoal/management',
        'security.management_credentials_dir',
        '/etc/shoal/management',
    ),
    'SHOAL_SASL_TIMEOUT_SECONDS': ('3', 'security.sasl_timeout_seconds', 3.0),
    'SHOAL_OPEN_TIMEOUT_SECONDS': ('30', 'security.open_timeout_seconds', 30.0),
    'SHOAL_TLS_LISTEN': ('0.0.0.0:5671', 'security.tls_listen', '0.0.0.0:5671'),
    'SHOAL_TLS_CERT_FILE': ('/tls/tls.crt', 'security.tls_cert_file', '/tls/tls.crt'),
    'SHOAL_TLS_KEY_FILE': ('/tls/tls.key', 'security.tls_key_file', '/tls/tls.key'),
    'SHOAL_TLS_CLIENT_CA_FILE': ('/tls/ca.crt', 'security.tls_client_ca_file', '/tls/ca.crt'),
    'SHOAL_TLS_CLIENT_AUTH': ('required', 'security.tls_client_auth', ClientAuth.REQUIRED),
    'SHOAL_TLS_RELOAD_INTERVAL_SECONDS': ('2', 'security.tls_reload_interval_seconds', 2.0),
    'SHOAL_REDIS_CA_FILE': ('/redis/ca.crt', 'security.redis_ca_file', '/redis/ca.crt'),
    'SHOAL_MAX_CONNECTIONS': ('100', 'security.max_connections', 100),
    'SHOAL_MAX_CONNECTIONS_PER_USER': ('5', 'security.max_connections_per_user', 5),
    'SHOAL_MAX_SESSIONS_PER_CONNECTION': ('7', 'security.max_sessions_per_connection', 7),
    'SHOAL_MAX_LINKS_PER_SESSION': ('9', 'security.max_links_per_session', 9),
    'SHOAL_MAX_SUBSCRIPTIONS_PER_TOPIC': ('4', 'security.max_subscriptions_per_topic', 4),
    'SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER': (
        '7',
        'security.max_auto_created_addresses_per_user',
        7,
    ),
    'SHOAL_METRICS_MAX_ADDRESSES': ('8', 'security.metrics_max_addresses', 8),
    'SHOAL_METRICS_MAX_CONSUMER_LINKS': ('12', 'security.metrics_max_consumer_links', 12),
    'SHOAL_MAX_FAILED_LOGINS_PER_MINUTE': ('9', 'security.max_failed_logins_per_minute', 9),
    'SHOAL_MAX_BACKLOG_PER_ADDRESS': ('1000', 'security.max_backlog_per_address', 1000),
    'SHOAL_BACKLOG_OVERFLOW': ('drop-oldest', 'security.backlog_overflow', Overflow.DROP_OLDEST),
    'SHOAL_MEMORY_CEILING_MB': ('512', 'security.memory_ceiling_mb', 512),
    'SHOAL_REDIS_MEMORY_HIGH_WATERMARK': ('0.8', 'security.redis_memory_high_watermark', 0.8),
    # duplicate detection
    'SHOAL_DUPLICATE_DETECTION': ('true', 'duplicates.enabled', True),
    'SHOAL_DUPLICATE_WINDOW': ('500', 'duplicates.window', 500),
    'SHOAL_DUPLICATE_WINDOW_SECONDS': ('60', 'duplicates.window_seconds', 60),
    'SHOAL_DUPLICATE_ID_PROPERTY': ('_AMQ_DUPL_ID', 'duplicates.id_property', '_AMQ_DUPL_ID'),
    'SHOAL_LAST_VALUE_ADDRESSES': (
        'prices.*, devices',
        'last_values.addresses',
        ('prices.*', 'devices'),
    ),
    'SHOAL_LAST_VALUE_PROPERTY': ('device', 'last_values.key_property', 'device'),
    # sends held through a store outage
    'SHOAL_STORE_HOLD_SECONDS': ('45', 'store.hold_seconds', 45.0),
    'SHOAL_STORE_HOLD_MAX_BYTES': ('1048576', 'store.hold_max_bytes', 1048576),
}

DEFAULTS: dict[str, Any] = {
    'amqp.listen': '127.0.0.1:5672',
    'http': '127.0.0.1:8080',
    'store.redis_url': None,
    'store.data_dir': '.data/redis',
    'log_format': LogFormat.TEXT,
    'log_level': 'INFO',
    'amqp.idle_timeout_seconds': 60.0,
    'amqp.max_frame_size': 1048576,
    'amqp.max_message_size': 67108864,
    'amqp.producer_credit': 1000,
    'routing.auto_create_queues': True,
    'routing.auto_create_topics': True,
    'routing.default_address_kind': AddressKind.QUEUE,
    'routing.max_delivery_attempts': 10,
    'routing.dead_letter_address': 'DLQ',
    'routing.expiry_address': '',
    'store.trim_interval_seconds': 5.0,
    'shutdown_grace_seconds': 10.0,
    'security.allow_anonymous': True,
    'security.users_file': '',
    'security.tls_listen': '',
    'security.tls_client_auth': ClientAuth.NONE,
    'security.max_connections': 0,
    'security.backlog_overflow': Overflow.REJECT_PUBLISH,
    'security.redis_memory_high_watermark': 0.9,
    'duplicates.enabled': False,
    'duplicates.window': 10_000,
    'duplicates.window_seconds': 600,
    'duplicates.id_property': '',
}


def field(s: BrokerSettings, path: str) -> Any:
    value: Any = s
    for part in path.split('.'):
        value = getattr(value, part)
    return value


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No SHOAL_* variable from the calling shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith('SHOAL_'):
            monkeypatch.delenv(name)
    return monkeypatch


def test_the_table_covers_every_variable_settings_reads() -> None:
    declared = {v for k, v in vars(settings).items() if k.startswith('ENV_')}
    assert declared == set(EVERY_VARIABLE)


@pytest.mark.parametrize(
    ('variable', 'value', 'path', 'expected'),
    [(k, *v) for k, v in EVERY_VARIABLE.items()],
    ids=list(EVERY_VARIABLE),
)
def test_each_variable_sets_its_field_with_its_type(
    variable: str, value: str, path: str, expected: Any
) -> None:
    s = BrokerSettings.from_env({variable: value})
    assert field(s, path) == expected
    assert type(field(s, path)) is type(expected)


def test_all_variables_together_set_all_fields() -> None:
    s = BrokerSettings.from_env({k: v[0] for k, v in EVERY_VARIABLE.items()})
    for _, path, expected in EVERY_VARIABLE.values():
        assert field(s, path) == expected, path


def test_one_variable_leaves_the_other_fields_at_their_defaults() -> None:
    s = BrokerSettings.from_env({'SHOAL_MAX_FRAME_SIZE': '4096'})
    for path, default in DEFAULTS.items():
        if path != 'amqp.max_frame_size':
            assert field(s, path) == default, path


@pytest.mark.parametrize(('path', 'default'), DEFAULTS.items(), ids=list(DEFAULTS))
def test_defaults_when_no_variable_is_set(path: str, default: Any) -> None:
    s = BrokerSettings.from_env({})
    assert field(s, path) == default
    assert type(field(s, path)) is type(default)


def test_the_default_replica_id_is_hostname_and_pid() -> None:
    expected = f'{socket.gethostname()}-{os.getpid()}'
    assert BrokerSettings.from_env({}).replica_id == expected
    assert BrokerSettings.from_env({'SHOAL_REPLICA_ID': ''}).replica_id == expected


def test_an_empty_redis_url_means_embedded_redis() -> None:
    assert BrokerSettings.from_env({'SHOAL_REDIS_URL': ''}).store.redis_url is None


def test_an_empty_http_disables_the_endpoint() -> None:
    assert BrokerSettings.from_env({'SHOAL_HTTP': ''}).http == ''


def test_an_empty_dead_letter_address_means_drop() -> None:
    assert (
        BrokerSettings.from_env({'SHOAL_DEAD_LETTER_ADDRESS': ''}).routing.dead_letter_address == ''
    )


def test_from_env_reads_os_environ_by_default(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv('SHOAL_PRODUCER_CREDIT', '5')
    assert BrokerSettings.from_env().amqp.producer_credit == 5


@pytest.mark.parametrize(
    ('value', 'expected'),
    [
        ('1', True),
        ('true', True),
        ('TRUE', True),
        ('Yes', True),
        ('on', True),
        ('0', False),
        ('false', False),
        ('False', False),
        ('NO', False),
        ('off', False),
    ],
)
@pytest.mark.parametrize('variable', ['SHOAL_AUTO_CREATE_QUEUES', 'SHOAL_AUTO_CREATE_TOPICS'])
def test_boolean_variables_accept_the_usual_spellings(
    variable: str, value: str, expected: bool
) -> None:
    s = BrokerSettings.from_env({variable: value})
    name = variable.removeprefix('SHOAL_').lower()
    assert getattr(s.routing, name) is expected


@pytest.mark.parametrize('value', ['maybe', '', '2', 'tru', ' true', 'y'])
@pytest.mark.parametrize('variable', ['SHOAL_AUTO_CREATE_QUEUES', 'SHOAL_AUTO_CREATE_TOPICS'])
def test_a_bad_boolean_is_an_error_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable):
        BrokerSettings.from_env({variable: value})


@pytest.mark.parametrize(
    ('variable', 'value'),
    [
        ('SHOAL_MAX_FRAME_SIZE', 'big'),
        ('SHOAL_IDLE_TIMEOUT_SECONDS', 'soon'),
        ('SHOAL_DEFAULT_ADDRESS_KIND', 'exchange'),
        ('SHOAL_LOG_FORMAT', 'xml'),
    ],
)
def test_other_bad_values_are_value_errors(variable: str, value: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - cli.main reports any ValueError
        BrokerSettings.from_env({variable: value})


@pytest.mark.parametrize('value', ['-1', '32k', '', '1.5'])
def test_a_bad_big_message_size_is_an_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match='SHOAL_BIG_MESSAGE_BYTES'):
        BrokerSettings.from_env({'SHOAL_BIG_MESSAGE_BYTES': value})


# -- the command line -------------------------------------------------------------------------


def test_without_options_the_command_line_uses_the_environment(
    clean_env: pytest.MonkeyPatch,
) -> None:
    for variable in ('SHOAL_LISTEN', 'SHOAL_REDIS_URL', 'SHOAL_DATA_DIR', 'SHOAL_REPLICA_ID'):
        clean_env.setenv(variable, EVERY_VARIABLE[variable][0])
    clean_env.setenv('SHOAL_HTTP', '')
    clean_env.setenv('SHOAL_MAX_DELIVERY_ATTEMPTS', '3')

    s = cli.settings_from([])

    assert s.amqp.listen == '0.0.0.0:5673'
    assert s.store.redis_url == 'redis://r:6379/2'
    assert s.store.data_dir == '/var/lib/shoal'
    assert s.replica_id == 'pod-7'
    assert s.http == ''
    assert s.routing.max_delivery_attempts == 3


def test_without_options_or_environment_the_command_line_gives_the_defaults(
    clean_env: pytest.MonkeyPatch,
) -> None:
    s = cli.settings_from([])
    for path, default in DEFAULTS.items():
        assert field(s, path) == default, path


@pytest.mark.parametrize(
    ('option', 'variable', 'path'),
    [
        ('--listen', 'SHOAL_LISTEN', 'amqp.listen'),
        ('--redis-url', 'SHOAL_REDIS_URL', 'store.redis_url'),
        ('--data-dir', 'SHOAL_DATA_DIR', 'store.data_dir'),
        ('--replica-id', 'SHOAL_REPLICA_ID', 'replica_id'),
        ('--http', 'SHOAL_HTTP', 'http'),
    ],
)
def test_a_command_line_option_wins_over_its_variable(
    clean_env: pytest.MonkeyPatch, option: str, variable: str, path: str
) -> None:
    clean_env.setenv(variable, 'from-env')
    clean_env.setenv('SHOAL_PRODUCER_CREDIT', '7')

    s = cli.settings_from([option, 'from-command-line'])

    assert field(s, path) == 'from-command-line'
    assert s.amqp.producer_credit == 7


def test_all_options_together(clean_env: pytest.MonkeyPatch) -> None:
    for variable in ('SHOAL_LISTEN', 'SHOAL_REDIS_URL', 'SHOAL_DATA_DIR', 'SHOAL_REPLICA_ID'):
        clean_env.setenv(variable, 'from-env')
    argv = ['--listen', '10.0.0.1:1', '--redis-url', 'redis://x', '--data-dir', 'd']
    argv += ['--replica-id', 'r', '--http', '10.0.0.1:2']

    s = cli.settings_from(argv)

    assert (s.amqp.listen, s.store.redis_url, s.store.data_dir) == ('10.0.0.1:1', 'redis://x', 'd')
    assert (s.replica_id, s.http) == ('r', '10.0.0.1:2')


def test_an_empty_http_option_disables_the_endpoint_set_in_the_environment(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv('SHOAL_HTTP', '0.0.0.0:8080')
    assert cli.settings_from(['--http', '']).http == ''


def test_a_bad_environment_variable_fails_the_command_line(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv('SHOAL_AUTO_CREATE_TOPICS', 'sometimes')
    with pytest.raises(ValueError, match='SHOAL_AUTO_CREATE_TOPICS'):
        cli.settings_from(['--listen', '127.0.0.1:1'])


def test_main_reports_a_bad_variable_and_exits_with_usage_status(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv('SHOAL_AUTO_CREATE_QUEUES', 'sometimes')
    assert cli.main([]) == 2
    assert 'SHOAL_AUTO_CREATE_QUEUES' in capsys.readouterr().err


@pytest.mark.parametrize('ratio', ['-0.1', '1.5'])
def test_a_tracing_ratio_outside_0_to_1_is_refused(ratio: str) -> None:
    with pytest.raises(ValueError, match='sample ratio must be within'):
        BrokerSettings.from_env({'SHOAL_TRACING_SAMPLE_RATIO': ratio})


def test_the_broker_runs_without_opentelemetry_while_tracing_is_off() -> None:
    """The SDK is the ``tracing`` extra's, imported only when tracing is on: in a fresh
    interpreter where importing it fails, the broker's modules load and tracing starts as off."""
    code = (
        'import sys; sys.modules["opentelemetry"] = None; '
        'import shoal_broker.app, shoal_broker.amqp.broker, shoal_broker.tracing as t; '
        'from shoal_broker.settings import TracingSettings; '
        'print(t.start(TracingSettings(), "r") is None)'
    )
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == 'True'
