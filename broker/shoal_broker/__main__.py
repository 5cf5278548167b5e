"""``python -m shoal_broker``: the same entry point as the ``shoal-broker`` script."""

from shoal_broker import cli

if __name__ == '__main__':
    raise SystemExit(cli.main())
