"""
The Redis URL a BrokerCluster's ``spec.redis`` names, in the forms the broker takes.

Pure: the credentials are read from their Secrets by the caller (``Runtime``), which gives the
brokers this URL through the cluster's ``<name>-redis-url`` Secret and opens the operator's own
connection (registry, status) with the same URL. The forms::

    redis://[[user]:password@]host[:port]/db                   rediss:// with TLS
    redis+sentinel://[[user]:password@]host[:port][,...]/service/db[?sentinel_username=..&sentinel_password=..]
    redis+cluster://[[user]:password@]host[:port][,...]        rediss+cluster:// with TLS

With a CA, ``ssl_ca_certs`` names the file holding it (where the pods mount it, or the operator's
own copy).
"""

import dataclasses
import urllib.parse

from shoal_operator.models import RedisMode, RedisSpec

_SCHEMES = {
    RedisMode.STANDALONE: ('redis', 'rediss'),
    RedisMode.SENTINEL: ('redis+sentinel', 'rediss+sentinel'),
    RedisMode.CLUSTER: ('redis+cluster', 'rediss+cluster'),
}
_MODE_OF_SCHEME = {s: mode for mode, pair in _SCHEMES.items() for s in pair} | {
    'unix': RedisMode.STANDALONE
}


@dataclasses.dataclass(frozen=True, slots=True)
class Secrets:
    """What the operator read from the Secrets ``spec.redis`` names."""

    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe='')


def render(spec: RedisSpec, secrets: Secrets, ca_file: str | None = None) -> str:
    """The URL of a spec without ``url_secret``; ``ca_file`` where the CA of
    ``tls.caSecretName`` is, when the spec has one."""
    if not spec.rendered:
        raise ValueError('the URL is in spec.redis.secretName, not rendered')
    mode = spec.effective_mode
    scheme = _SCHEMES[mode][spec.tls]
    userinfo = ''
    if secrets.password or secrets.username:
        userinfo = f'{_quote(secrets.username or "")}:{_quote(secrets.password or "")}@'
    path = {
        RedisMode.STANDALONE: f'/{spec.db}',
        RedisMode.SENTINEL: f'/{_quote(spec.service)}/{spec.db}',
        RedisMode.CLUSTER: '',
    }[mode]
    options = []
    if secrets.sentinel_username is not None:
        options.append(('sentinel_username', secrets.sentinel_username))
    if secrets.sentinel_password is not None:
        options.append(('sentinel_password', secrets.sentinel_password))
    if spec.tls and spec.ca_secret is not None and ca_file:
        options.append(('ssl_ca_certs', ca_file))
    query = f'?{urllib.parse.urlencode(options, quote_via=urllib.parse.quote)}' if options else ''
    return f'{scheme}://{userinfo}{",".join(spec.hosts)}{path}{query}'


def mode_of(url: str) -> RedisMode | None:
    """The mode a URL's scheme names; None for a scheme the broker does not take."""
    return _MODE_OF_SCHEME.get(url.partition('://')[0].lower())


def mismatch(spec: RedisSpec, url: str) -> str | None:
    """Why the URL in ``spec.redis.secretName`` does not agree with ``spec.redis.mode``."""
    if spec.mode is None:
        return None
    found = mode_of(url)
    if found is spec.mode:
        return None
    scheme = url.partition('://')[0] if '://' in url else '(none)'
    return f"spec.redis.mode is {spec.mode.value} but the URL's scheme is {scheme}"
