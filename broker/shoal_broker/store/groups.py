"""
The commands of a replica letting go of message groups (docs/architecture.md, "Message groups"):
all of them when its last consumer of a subscription leaves or it is reaped
(``lua/groups_drop.lua``), some when they are idle or a consumer joins an entity that rebalances
its groups (``lua/groups_forget.lua``). Ownership is taken and read inside ``lua/fetch.lua``.
"""

from collections.abc import Sequence
from typing import Any

from shoal_broker.store import keys
from shoal_broker.store.lines import Script


def drop_keys(address: str, group: str) -> tuple[str, ...]:
    """``groups_drop.lua``'s KEYS."""
    k = keys.AddressKeys.of(address)
    return (k.group_owners(group), k.group_parked(group), k.group_held(group), k.returned(group))


def drop_command(script: Script, replica: str, address: str, group: str) -> tuple[Any, ...]:
    notify = keys.AddressKeys.of(address).notify
    return script('groups_drop', drop_keys(address, group), (replica, notify))


def forget_command(
    script: Script, replica: str, address: str, group: str, groups: Sequence[str]
) -> tuple[Any, ...]:
    k = keys.AddressKeys.of(address)
    return script('groups_forget', (k.group_owners(group), k.group_held(group)), (replica, *groups))
