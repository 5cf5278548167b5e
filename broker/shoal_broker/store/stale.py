"""
Pools that replace a connection Redis closed while it sat idle.

redis-py's pools check an idle connection before handing it out (its end read: connect again),
but skip that check while maintenance notifications are configured, and redis-py's default for
them, ``auto``, counts. After a Redis restart, the first command on each pooled connection then
failed with "Connection closed by server": a link attach refused with "Redis unreachable" though
Redis was back. Shoal uses no maintenance notifications (a RESP3 push feature of managed Redis
offerings), so its pools turn them off and keep the check.
"""

from typing import Any

from redis.maint_notifications import MaintNotificationsConfig

CHECKED_POOL: dict[str, Any] = {
    'maint_notifications_config': MaintNotificationsConfig(enabled=False)
}
"""Pool arguments under every other argument of a Shoal pool (the caller's and the URL's win)."""
