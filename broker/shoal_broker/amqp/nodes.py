"""
The nodes this replica knows: each address's kind, and the local subscriptions of its consumers.

An address's kind is asked of the store once and remembered (``resolve``, which also creates an
address where the settings allow). A local subscription (``subscriptions.LocalSubscription``)
exists while this replica has consumers of it; it is made here (``subscription``) and takes the
declared policy of its queue or subscription (``apply_policies``). The parts that feed and drain
subscriptions are given once, when the broker is put together (``feed``).
"""

import itertools

from shoal_broker.amqp.guard import Guard
from shoal_broker.amqp.outlets import Intake, Outlet
from shoal_broker.amqp.subscriptions import LocalSubscription
from shoal_broker.metrics import registry as metrics
from shoal_broker.routing import addresses
from shoal_broker.routing.policies import NO_POLICY, EntityPolicy, entity_field
from shoal_broker.routing.storage import MessageStore
from shoal_broker.settings import AddressKind, BrokerSettings


class Nodes:
    def __init__(self, settings: BrokerSettings, store: MessageStore, guard: Guard) -> None:
        self.settings = settings
        self.store = store
        self.guard = guard
        self.kinds: dict[str, AddressKind] = {}
        self.subscriptions: dict[tuple[str, str], LocalSubscription] = {}
        self.by_address: dict[str, list[LocalSubscription]] = {}
        self.policies: dict[str, EntityPolicy] = {}
        """Declared queues' and subscriptions' policies by entity (``apply_policies``)."""
        self.paused: frozenset[str] = frozenset()
        """Entities whose delivery the management API paused (``apply_pauses``)."""
        self._serial = itertools.count(1)
        self._outlet: Outlet | None = None
        self._intake: Intake | None = None

    def feed(self, outlet: Outlet, intake: Intake) -> None:
        """The parts a local subscription deals to and hands held messages to."""
        self._outlet, self._intake = outlet, intake

    def subscription(self, address: str, group: str) -> LocalSubscription:
        sub = self.subscriptions.get((address, group))
        if sub is None:
            assert self._outlet is not None, 'Nodes.feed comes first'
            assert self._intake is not None, 'Nodes.feed comes first'
            sub = LocalSubscription(self._outlet, self._intake, address, group)
            metrics.subscription_seen(address, group)
            sub.apply(self.policy(address, group), self.settings.routing)
            sub.paused = entity_field(address, group) in self.paused
            self.subscriptions[(address, group)] = sub
            self.by_address.setdefault(address, []).append(sub)
            self.store.watching.watch(address, sub.on_notify)
        return sub

    def forget(self, address: str, group: str) -> None:
        """A subscription's last local consumer left."""
        sub = self.subscriptions.pop((address, group))
        self.by_address[address].remove(sub)
        if not self.by_address[address]:
            del self.by_address[address]
        self.store.watching.unwatch(address, sub.on_notify)

    def kick(self, address: str) -> None:
        """Entries may have arrived at ``address``: its local subscriptions fetch."""
        for sub in self.by_address.get(address, ()):
            sub.kick()

    def policy(self, address: str, group: str) -> EntityPolicy:
        return self.policies.get(entity_field(address, group)) or NO_POLICY

    def apply_pauses(self, paused: frozenset[str]) -> None:
        """The paused entities as just read from the store: a paused local subscription fetches
        nothing; one resumed fetches again at once."""
        if paused == self.paused:
            return
        self.paused = paused
        for (address, group), sub in self.subscriptions.items():
            sub.set_paused(entity_field(address, group) in paused)

    def apply_policies(self, policies: dict[str, EntityPolicy]) -> None:
        """The declared policies as just read from the store: every local subscription whose
        policy changed takes the new one (for its next deliveries and outcomes)."""
        if policies == self.policies:
            return
        self.policies = policies
        for (address, group), sub in self.subscriptions.items():
            sub.apply(self.policy(address, group), self.settings.routing)

    def next_serial(self) -> int:
        return next(self._serial)

    async def resolve(
        self, address: str, requested: AddressKind | None, creator: str | None = None
    ) -> AddressKind:
        """The kind of ``address``, creating it when allowed; BrokerError otherwise. A
        ``creator`` (user name) is held to its limit of addresses created on demand."""
        address = addresses.check_name(address)
        known = self.kinds.get(address)
        if known is not None and (requested is None or requested == known):
            return known
        existing = known or await self.store.registry.address_kind(address)
        decision = addresses.resolve(address, requested, existing, self.settings.routing)
        kind = decision.kind
        if decision.create:
            if creator is not None:
                self.guard.check_creation_room(creator)
            kind = await self.store.registry.create_address(address, decision.kind)
            if creator is not None:
                self.guard.address_created(creator)
            addresses.resolve(address, requested, kind, self.settings.routing)  # lost a race?
        if known is None:
            metrics.address_seen(address, topic=kind is AddressKind.TOPIC)
        self.kinds[address] = kind
        return kind
