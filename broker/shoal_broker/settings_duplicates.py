"""
The duplicate-detection settings (``BrokerSettings.duplicates``, docs/redis-modes.md#duplicate-
detection), in a module of their own to keep settings.py short; settings.py re-exports them and
holds their ``ENV_DUPLICATE_*`` names with the others (read by ``duplicates_from_env``).
"""

import dataclasses
from collections.abc import Mapping

from shoal_broker.settings_names import (
    ENV_DUPLICATE_DETECTION,
    ENV_DUPLICATE_ID_PROPERTY,
    ENV_DUPLICATE_WINDOW,
    ENV_DUPLICATE_WINDOW_SECONDS,
    env_flag,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DuplicateSettings:
    """Every address's duplicate detection unless its Queue/SharedSubscription says otherwise."""

    enabled: bool = False
    """Drop (and answer ``accepted``) a message whose id the address stored within the window."""
    window: int = 10_000
    """Ids remembered per address, newest kept (bounds the window's memory)."""
    window_seconds: int = 600
    """How long an id is remembered; older ones are forgotten, and accepted again."""
    id_property: str = ''
    """Application property holding the id (e.g. ``_AMQ_DUPL_ID``); empty: the AMQP message-id."""


def duplicates_from_env(env: Mapping[str, str], d: DuplicateSettings) -> DuplicateSettings:
    return DuplicateSettings(
        enabled=env_flag(env, ENV_DUPLICATE_DETECTION, d.enabled),
        window=int(env.get(ENV_DUPLICATE_WINDOW, d.window)),
        window_seconds=int(env.get(ENV_DUPLICATE_WINDOW_SECONDS, d.window_seconds)),
        id_property=env.get(ENV_DUPLICATE_ID_PROPERTY, d.id_property),
    )
