"""``python -m shoal_analytics``: the same as the ``shoal-analytics`` console script."""

from shoal_analytics.cli import main

raise SystemExit(main())
