"""
The last-value queue settings (``BrokerSettings.last_values``, docs/architecture.md#last-value-
queues), in a module of their own to keep settings.py short; settings.py re-exports them and
holds their ``ENV_LAST_VALUE_*`` names with the others.
"""

import dataclasses
import fnmatch
from collections.abc import Mapping

from shoal_broker.settings_names import ENV_LAST_VALUE_ADDRESSES, ENV_LAST_VALUE_PROPERTY

DEFAULT_KEY_PROPERTY = '_AMQ_LVQ_NAME'
"""ActiveMQ Artemis's last-value property: what JMS applications moving from it already set."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LastValueSettings:
    """Queues that keep only the newest unread message per key, unless their Queue says
    otherwise."""

    addresses: tuple[str, ...] = ()
    """Shell-style patterns (``prices.*``) of the queue addresses that are last-value queues."""
    key_property: str = DEFAULT_KEY_PROPERTY
    """Application property holding the key of such a queue's messages."""

    def __post_init__(self) -> None:
        if not self.key_property:
            raise ValueError('the last-value key property needs a name')

    def matches(self, address: str) -> bool:
        return any(fnmatch.fnmatchcase(address, pattern) for pattern in self.addresses)


def last_values_from_env(env: Mapping[str, str], d: LastValueSettings) -> LastValueSettings:
    patterns = env.get(ENV_LAST_VALUE_ADDRESSES)
    return LastValueSettings(
        addresses=d.addresses
        if patterns is None
        else tuple(p.strip() for p in patterns.split(',') if p.strip()),
        key_property=env.get(ENV_LAST_VALUE_PROPERTY, d.key_property),
    )
