"""Turning what a broker of this version wrote back into what an older version left (the address
registry as the one record of each address, named subscriptions in a SET, no epochs), for the
tests of the laying out at start (docs/redis-modes.md, "The key layout")."""

import redis

from shoal_broker.store import keys


def back_to_the_older_layout(
    client: redis.Redis, addresses: dict[str, str], subscription_id: str
) -> None:
    """``shoal:addresses`` holds the bare kind of each address (``queue``/``topic``), no meta
    record; the subscription is in the SET ``shoal:subscriptions``, its definition without an
    epoch."""
    for address, kind in addresses.items():
        client.delete(keys.AddressKeys.of(address).meta)
        client.hset(keys.ADDRESSES, address, kind)
    client.hdel(keys.SubscriptionKeys.of(subscription_id).definition, 'epoch')
    client.hdel(keys.SUBSCRIPTION_INDEX, subscription_id)
    client.sadd(keys.SUBSCRIPTIONS, subscription_id)
