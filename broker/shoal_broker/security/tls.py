"""
TLS for the ``amqps`` acceptor and the ``rediss://`` store connection, with Python's ``ssl``.

The server context is built once and kept: asyncio's server holds it, and loading a new
certificate chain into the same ``SSLContext`` changes what every later handshake presents,
so certificates are renewed (cert-manager rotates the Secret) without a restart and without
touching connections already open.

``load_cert_chain`` is not atomic: it installs the certificate, then fails on a key that does not
match it, leaving the live context with the new certificate and the old key, so every later
handshake fails. A renewal is therefore copied once into a private directory (the files may be
replaced again meanwhile), loaded into a scratch context, and only when that succeeds loaded from
the same copies into the live one: a mismatched or half-written pair keeps the previous pair.
"""

import logging
import os
import shutil
import ssl
import tempfile
import urllib.parse

from shoal_broker.settings import ClientAuth, SecuritySettings

logger = logging.getLogger(__name__)

_VERIFY = {
    ClientAuth.NONE: ssl.CERT_NONE,
    ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
    ClientAuth.REQUIRED: ssl.CERT_REQUIRED,
}


class ServerTls:
    def __init__(self, settings: SecuritySettings) -> None:
        if not (settings.tls_cert_file and settings.tls_key_file):
            raise ValueError('a TLS listener needs SHOAL_TLS_CERT_FILE and SHOAL_TLS_KEY_FILE')
        if settings.tls_client_auth is not ClientAuth.NONE and not settings.tls_client_ca_file:
            raise ValueError('client certificates need SHOAL_TLS_CLIENT_CA_FILE')
        self.settings = settings
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.verify_mode = _VERIFY[settings.tls_client_auth]
        self._stamps: dict[str, tuple[int, int]] = {}
        self._refused: dict[str, tuple[int, int]] = {}
        """The files of the last renewal that failed to load: not tried again until they change."""
        self._load()

    def _files(self) -> list[str]:
        s = self.settings
        return [f for f in (s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file) if f]

    def _stamp(self) -> dict[str, tuple[int, int]]:
        stamps = {}
        for path in self._files():
            st = os.stat(path)
            stamps[path] = (st.st_ino, st.st_mtime_ns)
        return stamps

    def _load(self) -> None:
        s = self.settings
        stamps = self._stamp()
        with tempfile.TemporaryDirectory(prefix='shoal-tls-') as private:
            cert = shutil.copyfile(s.tls_cert_file, os.path.join(private, 'cert.pem'))
            key = shutil.copyfile(s.tls_key_file, os.path.join(private, 'key.pem'))
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)  # or raise
            self.context.load_cert_chain(cert, key)
        if s.tls_client_ca_file:
            self.context.load_verify_locations(cafile=s.tls_client_ca_file)
        self._stamps = stamps

    def reload(self, *, only_if_changed: bool) -> bool:
        """Re-read the files (when they changed); a broken update keeps the old certificate."""
        stamps: dict[str, tuple[int, int]] = {}
        try:
            stamps = self._stamp()
            if only_if_changed and stamps in (self._stamps, self._refused):
                return False
            self._load()
        except (OSError, ssl.SSLError) as exc:
            self._refused = stamps
            logger.error('TLS certificate not reloaded, keeping the previous one: %s', exc)
            return False
        logger.info('TLS certificate reloaded from %s', self.settings.tls_cert_file)
        return True


def redis_url_with_ca(url: str, ca_file: str) -> str:
    """redis-py reads ``ssl_ca_certs`` from the URL's query: add the CA bundle to a rediss URL."""
    if not ca_file or not url.startswith(('rediss://', 'rediss+sentinel://', 'rediss+cluster://')):
        return url
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query = [(k, v) for k, v in query if k != 'ssl_ca_certs'] + [('ssl_ca_certs', ca_file)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
