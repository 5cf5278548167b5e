"""The Sentinel URL form (store/connect.py): sentinels, service, db, credentials, TLS, options."""

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
