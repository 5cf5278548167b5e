"""
Which JMS subscription an attach names: seed 000's twelve rows and Qpid JMS's link naming.

Pure. The protocol edge passes what the attach said (link name, the connection's container-id,
capabilities, terminus durability and expiry, filters); these functions answer which subscription
that is, in which namespace, with what lifetime (jms-amqp-facts §2.2, §3, §4, §10):

* shared subscriptions are named by the link name up to the first ``|`` (``sub``, ``sub|2``,
  ``sub|global``, ``sub|global2``, ``sub|volatile1``, ``sub|global-volatile1``); exclusive durable
  ones by the whole link name (Qpid JMS forbids ``|`` in names);
* the namespace is global when the source (or, for a null-source lookup, the link's desired
  capabilities) carries ``global``, else the connection's container-id (the JMS ClientID);
* durable means terminus durability 1 or 2, or expiry-policy ``never`` (both are checked);
* exclusive and shared durable subscriptions of one (ClientID, name) share one namespace, so a
  null-source lookup finds either; volatile (non-durable shared) ones live apart.
"""

import dataclasses
import enum
from collections.abc import Mapping

from shoal_broker.errors import InvalidField, NotAllowed

EXPIRY_NEVER = 'never'


class Scope(enum.StrEnum):
    CLIENT = 'client'
    """Named within one ClientID (container-id)."""
    GLOBAL = 'global'
    """Named by the subscription name alone, shared across connections."""


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionKey:
    """The identity of a named (durable or shared) subscription."""

    name: str
    scope: Scope
    client_id: str
    """The owning ClientID for CLIENT scope; empty for GLOBAL."""
    durable: bool

    @property
    def id(self) -> str:
        """Stable id: the consumer-group name and the registry key of the subscription."""
        lifetime = 'durable' if self.durable else 'volatile'
        owner = self.client_id if self.scope is Scope.CLIENT else '*'
        return f'{lifetime}:{self.scope}:{owner}:{self.name}'


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """What a subscriber attach asks for."""

    key: SubscriptionKey
    shared: bool
    topic: str
    selector: str | None = None
    no_local: bool = False

    @property
    def exclusive(self) -> bool:
        return not self.shared

    def definition(self) -> dict[str, str]:
        """The fields stored for the subscription; a change in any of them means a new one."""
        return {
            'topic': self.topic,
            'selector': self.selector or '',
            'no_local': '1' if self.no_local else '0',
        }


def is_durable(durability: int, expiry_policy: str) -> bool:
    return durability in (1, 2) or expiry_policy == EXPIRY_NEVER


def subscription_name(link_name: str, shared: bool) -> str:
    """The JMS subscription name a link name carries."""
    name = link_name.split('|', 1)[0] if shared else link_name
    if not name:
        raise InvalidField('a subscription link needs a name')
    return name


def key_for(
    link_name: str, container_id: str | None, capabilities: set[str], durable: bool
) -> SubscriptionKey:
    shared = 'shared' in capabilities
    scope = Scope.GLOBAL if 'global' in capabilities else Scope.CLIENT
    if scope is Scope.CLIENT and not container_id:
        raise InvalidField('a ClientID-scoped subscription needs a container-id')
    return SubscriptionKey(
        name=subscription_name(link_name, shared),
        scope=scope,
        client_id=container_id or '' if scope is Scope.CLIENT else '',
        durable=durable,
    )


def spec_for_attach(
    *,
    link_name: str,
    container_id: str | None,
    capabilities: set[str],
    durability: int,
    expiry_policy: str,
    topic: str,
    selector: str | None,
    no_local: bool,
) -> SubscriptionSpec | None:
    """The named subscription a topic consumer attach asks for; None for a plain subscriber."""
    durable = is_durable(durability, expiry_policy)
    shared = 'shared' in capabilities
    if not shared and not durable:
        return None  # rows 1 and 3: a private subscription that lives as long as the link
    return SubscriptionSpec(
        key=key_for(link_name, container_id, capabilities, durable),
        shared=shared,
        topic=topic,
        selector=selector or None,
        no_local=no_local,
    )


def lookup_key(
    link_name: str, container_id: str | None, desired_capabilities: set[str]
) -> SubscriptionKey:
    """The durable subscription a null-source attach (Qpid JMS unsubscribe) names."""
    return key_for(link_name, container_id, desired_capabilities, durable=True)


def check_declared(spec: SubscriptionSpec, definition: Mapping[str, str] | None) -> None:
    """With only declared subscriptions allowed: refuse a shared one no resource declares (its
    stored definition has no ``owner``, see ``store/registry.py``)."""
    if spec.shared and not (definition or {}).get('owner'):
        raise NotAllowed(
            f'shared subscription {spec.key.name!r} is not declared by a SharedSubscription'
        )
