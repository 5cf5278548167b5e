"""
``shoal-broker``: command-line options over ``SHOAL_*`` environment variables over defaults.

The only place logging is configured and the event loop chosen (uvloop when installed).
"""

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence

from shoal_broker import app
from shoal_broker.settings import BrokerSettings, LogFormat

logger = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='shoal-broker',
        description='Shoal: an AMQP 1.0 broker for JMS 2.0 applications, state in Redis.',
        epilog='Every option also reads its SHOAL_* environment variable (see README).',
    )
    p.add_argument('--listen', help='AMQP HOST:PORT (SHOAL_LISTEN, default 127.0.0.1:5672)')
    p.add_argument('--redis-url', help='Redis URL (SHOAL_REDIS_URL); absent = embedded Redis')
    p.add_argument('--data-dir', help='embedded Redis data directory (SHOAL_DATA_DIR)')
    p.add_argument('--replica-id', help='replica name (SHOAL_REPLICA_ID, default hostname-pid)')
    p.add_argument('--http', help='health/metrics HOST:PORT, empty = off (SHOAL_HTTP)')
    return p


def settings_from(argv: Sequence[str] | None = None) -> BrokerSettings:
    args = parser().parse_args(argv)
    settings = BrokerSettings.from_env()
    if args.listen:
        settings = dataclasses.replace(
            settings, amqp=dataclasses.replace(settings.amqp, listen=args.listen)
        )
    store = settings.store
    if args.redis_url:
        store = dataclasses.replace(store, redis_url=args.redis_url)
    if args.data_dir:
        store = dataclasses.replace(store, data_dir=args.data_dir)
    settings = dataclasses.replace(settings, store=store)
    if args.replica_id:
        settings = dataclasses.replace(settings, replica_id=args.replica_id)
    if args.http is not None:
        settings = dataclasses.replace(settings, http=args.http)
    return settings


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            'ts': time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(record.created))
            + f'.{int(record.msecs):03d}Z',
            'level': record.levelname.lower(),
            'logger': record.name,
            'msg': record.getMessage(),
        }
        if record.exc_info:
            entry['exc'] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: BrokerSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format is LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter('%(asctime)s %(levelname)s %(name)s: %(message)s'))
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = settings_from(argv)
    except ValueError as exc:
        sys.stderr.write(f'shoal-broker: {exc}\n')
        return 2
    configure_logging(settings)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        return runner(app.serve(settings))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        logger.critical('broker failed: %s', exc, exc_info=True)
        return 1
