"""The Sentinel and Redis Cluster URL forms (store/connect.py): hosts, service, db, credentials,
TLS, options."""

import pytest

from shoal_broker.store import connect


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_db() -> None:
    url = connect.parse_sentinel_url('redis+sentinel://10.0.0.1,10.0.0.2:26380,[::1]:5/shoal/3')
    assert url.sentinels == (('10.0.0.1', 26379), ('10.0.0.2', 26380), ('::1', 5))
    assert url.service == 'shoal'
    assert url.connection == {'db': 3}
    assert url.sentinel == {}
    assert not url.tls


def test_credentials_are_the_servers_and_sentinel_options_the_sentinels() -> None:
    url = connect.parse_sentinel_url(
        'redis+sentinel://app:p%40ss@s1/shoal?sentinel_password=sp&socket_timeout=2'
    )
    assert url.connection == {'username': 'app', 'password': 'p@ss', 'socket_timeout': 2.0}
    assert url.sentinel == {'password': 'sp', 'socket_timeout': 2.0}


def test_rediss_sentinel_is_tls_to_servers_and_sentinels_alike() -> None:
    url = connect.parse_sentinel_url('rediss+sentinel://s1/shoal/0?ssl_ca_certs=/ca.pem')
    assert url.tls
    assert url.connection == {'db': 0, 'ssl': True, 'ssl_ca_certs': '/ca.pem'}
    assert url.sentinel == {'ssl': True, 'ssl_ca_certs': '/ca.pem'}


@pytest.mark.parametrize(
    ('url', 'why'),
    [
        ('redis+sentinel://s1', 'names the primary'),
        ('redis+sentinel:///shoal', 'at least one sentinel'),
        ('redis+sentinel://s1:port/shoal', 'bad sentinel port'),
        ('redis+sentinel://s1/shoal/0/more', 'names the primary'),
        ('redis://s1/0', 'not a Sentinel URL'),
    ],
)
def test_a_bad_sentinel_url_is_refused(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        connect.parse_sentinel_url(url)


def test_a_standalone_url_keeps_redis_pys_pool() -> None:
    pool = connect.connection_pool('redis://127.0.0.1:6390/2', blocking=True, max_connections=3)
    assert type(pool).__name__ == 'BlockingConnectionPool'
    assert pool.connection_kwargs['db'] == 2
    assert not connect.is_sentinel_url('redis://127.0.0.1:6390/2')
    assert connect.is_sentinel_url('REDIS+SENTINEL://s1/shoal')


def test_a_cluster_url_lists_its_seed_nodes() -> None:
    url = connect.parse_cluster_url('redis+cluster://10.0.0.1,10.0.0.2:7001,[::1]:7002')
    assert url.nodes == (('10.0.0.1', 6379), ('10.0.0.2', 7001), ('::1', 7002))
    assert url.connection == {}
    assert not url.tls
    assert connect.is_cluster_url('REDIS+CLUSTER://n1')
    assert not connect.is_cluster_url('redis+sentinel://s1/shoal')


def test_a_cluster_url_carries_credentials_tls_and_options() -> None:
    url = connect.parse_cluster_url(
        'rediss+cluster://app:p%40ss@n1:7000,n2/0?ssl_ca_certs=/ca.pem&socket_timeout=2'
    )
    assert url.tls
    assert url.nodes == (('n1', 7000), ('n2', 6379))
    assert url.connection == {
        'username': 'app', 'password': 'p@ss', 'ssl': True, 'ssl_ca_certs': '/ca.pem',
        'socket_timeout': 2.0,
    }  # fmt: skip


def test_a_password_alone_and_a_trailing_slash_are_fine() -> None:
    url = connect.parse_cluster_url('redis+cluster://:s3cret@n1/')
    assert url.connection == {'password': 's3cret'}


@pytest.mark.parametrize(
    ('url', 'why'),
    [
        ('redis+cluster://', 'at least one seed node'),
        ('redis+cluster://:pw@/0', 'at least one seed node'),
        ('redis+cluster://n1:port', 'bad cluster node port'),
        ('redis+cluster://n1:70000', 'bad cluster node port'),
        ('redis+cluster://:7000', 'bad cluster node address'),
        ('redis+cluster://n1/2', 'only database 0'),
        ('redis+cluster://n1/0/x', 'only database 0'),
        ('redis+cluster://n1?db=1', 'option db is not one'),
        ('redis+cluster://n1?retry_on_timeout=yes', 'option retry_on_timeout is not one'),
        ('redis+cluster://n1?socket_timeout=soon', 'socket_timeout'),
        ('redis+sentinel://s1/shoal', 'not a Redis Cluster URL'),
    ],
)
def test_a_bad_cluster_url_is_refused(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        connect.parse_cluster_url(url)


async def test_a_cluster_url_builds_a_cluster_client_of_every_seed() -> None:
    client = connect.cluster_client(
        'redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001?socket_timeout=3',
        socket_timeout=9, timeout=20, max_connections=5,
    )  # fmt: skip
    try:
        seeds = sorted(node.name for node in client.nodes_manager.startup_nodes.values())
        assert seeds == ['127.0.0.1:7000', '127.0.0.1:7001']
        assert client.connection_kwargs['socket_timeout'] == 3  # the URL's option wins
        assert client.connection_kwargs['password'] == 'pw'
    finally:
        await connect.close(client)


def test_a_cluster_url_is_not_taken_for_a_single_pool() -> None:
    with pytest.raises(ValueError, match='does not run on Redis Cluster yet'):
        connect.connection_pool('redis+cluster://127.0.0.1:7000')
    with pytest.raises(ValueError, match='does not run on Redis Cluster yet'):
        connect.sync_client('redis+cluster://127.0.0.1:7000')
