"""
AMQP local transactions (jms-amqp-facts §7): the coordinator link, declare and discharge.

A transaction lives in this replica's memory until it is discharged: transactional sends are
held (invisible to consumers) and transactional acks keep their entries pending in Redis. Commit
applies every send and ack in one Redis MULTI/EXEC, so it is atomic across any number of
addresses and is never half-applied. If the replica dies before the commit, nothing was applied:
the held sends are gone and the acked entries, still pending under the dead replica, are
redelivered by the reaper with delivery-count + 1 — a rollback. Rollback does the same at once.
A commit whose outcome the store cannot learn (``CommitInDoubt``) closes the client's connection
unanswered; its acked entries stay held until the store knows, and are returned only if nothing
of it was applied. Through a store outage a commit is tried again for up to the hold's bound
(``SHOAL_STORE_HOLD_SECONDS``, ``_commit_within_hold``): while the store says nothing of it ran,
or until it learns that of a commit in doubt; only then is it answered.

python-qpid-proton 0.40 has no constants for these dispositions, so they are used by number (the
outcomes' numbers from the table in ``outcome_codes.py``).
"""

import asyncio
import dataclasses
import itertools
import logging
import os
from collections.abc import Awaitable
from typing import Any, Final

import proton

from shoal_broker.amqp import codec, engine
from shoal_broker.amqp.engine import Ptr, lib
from shoal_broker.amqp.links import LinkState
from shoal_broker.amqp.nodes import Nodes
from shoal_broker.amqp.outcome_codes import ACCEPTED
from shoal_broker.amqp.returns import Returns
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import BrokerError, CommitInDoubt, StoreUnavailable
from shoal_broker.routing.storage import Entry, MessageStore, OutgoingMessage
from shoal_broker.settings import AddressKind

logger = logging.getLogger(__name__)

DECLARE: Final = 0x31
DISCHARGE: Final = 0x32
DECLARED: Final = 0x33
COORDINATOR_CAPABILITIES: Final = [
    'amqp:local-transactions', 'amqp:multi-txns-per-ssn', 'amqp:multi-ssns-per-txn',
]  # fmt: skip


class TransactionError(BrokerError):
    condition = 'amqp:transaction:rollback'


class UnknownTransaction(BrokerError):
    condition = 'amqp:transaction:unknown-id'


@dataclasses.dataclass(eq=False)
class Transaction:
    id: bytes
    coordinator: 'CoordinatorLink'
    sends: list[tuple[str, AddressKind, OutgoingMessage]] = dataclasses.field(default_factory=list)
    acks: list[tuple[str, str, Entry]] = dataclasses.field(default_factory=list)
    naming: list['asyncio.Future[None]'] = dataclasses.field(default_factory=list)
    """Accepts of deliveries sent ahead whose entries the store has not named yet: a discharge
    waits for them, or a commit would miss them (``Consuming._transactional_ack``)."""


@dataclasses.dataclass(eq=False, slots=True)
class CoordinatorLink(LinkState):
    """A peer's transaction controller: declares and discharges arrive on it."""

    transactions: dict[bytes, Transaction] = dataclasses.field(default_factory=dict)


_serial = itertools.count(1)


def new_id() -> bytes:
    """Unique across replicas and restarts: process-random prefix and a counter."""
    return _PREFIX + next(_serial).to_bytes(8, 'big')


_PREFIX = os.urandom(8)


def transaction_of(delivery_state: Ptr) -> tuple[bytes | None, Any]:
    """The transaction id and outcome in a transactional-state disposition or transfer state."""
    data = engine.data_object(lib.pn_disposition_data(delivery_state))
    if not isinstance(data, list | tuple) or not data:
        return None, None
    txn = data[0]
    outcome = data[1] if len(data) > 1 else None
    return (bytes(txn) if isinstance(txn, bytes | memoryview) else None), outcome


def reply(delivery: Ptr, state: int, fields: list[Any]) -> None:
    """Settle a delivery with a disposition proton has no constant for (declared, txn state)."""
    d = proton.Data(lib.pn_disposition_data(lib.pn_delivery_local(delivery)))
    d.clear()
    d.put_object(fields)
    lib.pn_delivery_update(delivery, state)
    lib.pn_delivery_settle(delivery)


def accepted_in(txn_id: bytes) -> list[Any]:
    return [txn_id, proton.Described(proton.ulong(ACCEPTED), [])]


class Coordinator:
    """Declares, discharges and rolls back the transactions of this replica's connections."""

    def __init__(
        self,
        store: MessageStore,
        turns: Turns,
        nodes: Nodes,
        returns: Returns,
        hold_seconds: float = 0.0,
    ) -> None:
        self.store = store
        self.hold_seconds = hold_seconds
        """How long a commit is tried again through a store outage (0: once)."""
        self.turns = turns
        self.nodes = nodes
        self.returns = returns
        self.open: dict[bytes, Transaction] = {}
        self.in_doubt: dict[bytes, Transaction] = {}
        """Transactions whose commit's outcome the store is still learning: their acknowledged
        entries stay pending until it is known."""
        self.committing: dict[bytes, Transaction] = {}
        """Transactions whose commit is under way (tried again through an outage): their
        acknowledged entries stay pending meanwhile."""

    def control(self, link: CoordinatorLink, delivery: Ptr) -> None:
        """A declare or discharge arrived on a coordinator link."""
        if lib.pn_delivery_partial(delivery) or not lib.pn_delivery_readable(delivery):
            return
        pending = lib.pn_delivery_pending(delivery)
        data = bytearray(pending)
        lib.pn_link_recv(link.ptr, engine.ffi.from_buffer(data), pending)
        lib.pn_link_advance(link.ptr)
        lib.pn_link_flow(link.ptr, 1)
        try:
            request = codec.body_value(data)
        except codec.DecodeError:
            request = None
        descriptor = getattr(request, 'descriptor', None)
        fields = getattr(request, 'value', None) or []
        if descriptor == DECLARE:
            txn = Transaction(new_id(), link)
            self.open[txn.id] = txn
            link.transactions[txn.id] = txn
            reply(delivery, DECLARED, [txn.id])
        elif descriptor == DISCHARGE and fields:
            txn_id = bytes(fields[0]) if isinstance(fields[0], bytes | memoryview) else b''
            fail = bool(fields[1]) if len(fields) > 1 else False
            self.turns.spawn(self._discharge(link, delivery, txn_id, fail))
        else:
            _reject(delivery, BrokerError('expected a declare or a discharge'))
        self.turns.mark_dirty(link.conn)

    async def _discharge(
        self, link: CoordinatorLink, delivery: Ptr, txn_id: bytes, fail: bool
    ) -> None:
        txn = self.open.get(txn_id)
        if txn is not None and txn.naming:  # open meanwhile, so that they join its acks
            naming, txn.naming = txn.naming, []
            await asyncio.gather(*naming)
        txn = self.open.pop(txn_id, None)
        link.transactions.pop(txn_id, None)
        error: BrokerError | None = None
        if txn is None:
            error = UnknownTransaction('no such transaction')
        elif fail:
            await self.rollback(txn)
        else:
            self.committing[txn.id] = txn
            try:
                await self._commit_within_hold(txn)
            except CommitInDoubt as exc:
                self._in_doubt(link, txn, exc)
                return
            except BrokerError as exc:
                await self.rollback(txn)
                error = TransactionError(f'the commit could not be applied: {exc}')
            else:
                self._committed(txn)
            finally:
                self.committing.pop(txn.id, None)
        if link.alive and link.conn.alive:
            if error is None:
                lib.pn_delivery_update(delivery, lib.PN_ACCEPTED)
                lib.pn_delivery_settle(delivery)
            else:
                _reject(delivery, error)
            self.turns.mark_dirty(link.conn)

    async def _commit_within_hold(self, txn: Transaction) -> None:
        """Commit, trying again through a store outage for up to ``hold_seconds``: after a
        refusal that means nothing of it ran (``StoreUnavailable``: rolled back), and after a
        commit in doubt once the store learns that none of it applied. A commit in doubt whose
        outcome is not learnt within the bound, or is learnt applied, is raised as before: its
        in-doubt rules stay (applied but not known to be confirmed is no accept)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_seconds
        pause = 0.05
        while True:
            try:
                await self.store.messages.commit(txn.sends, txn.acks)
                return
            except CommitInDoubt as exc:
                outcome = exc.outcome
                left = deadline - loop.time()
                if outcome is None or left <= 0 or asyncio.ensure_future(outcome).done():
                    raise  # already known: applied, not confirmed
                try:
                    applied = await asyncio.wait_for(asyncio.shield(outcome), left)
                except TimeoutError:
                    raise exc from None
                if applied:
                    raise exc from None
                logger.warning('a commit in doubt is found not applied: committing again')
            except StoreUnavailable as exc:
                if loop.time() + pause >= deadline:
                    raise
                logger.warning('commit not applied (%s): trying again in %.2f s', exc, pause)
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)

    def _in_doubt(self, link: CoordinatorLink, txn: Transaction, exc: CommitInDoubt) -> None:
        """The commit's record may be in Redis but its outcome could not be learnt: the store
        completes it or finds it gone later, all or nothing. Neither answer may go to the client
        (a rollback here would return acks the commit may still apply: duplicates), so the
        discharge stays unanswered and the connection closes: the client's commit fails with
        the connection, an outcome the application cannot take as either (jms-amqp-facts §7.3:
        only a settled reply is an answer). The acked entries stay pending until the store has
        learnt the outcome, and are returned if nothing was applied."""
        logger.error('transaction outcome unknown, closing the connection: %s', exc)
        if link.conn.alive:
            link.conn.fail('amqp:connection:forced', f'transaction outcome unknown: {exc}')
            self.turns.mark_dirty(link.conn)
        if exc.outcome is not None:
            self.in_doubt[txn.id] = txn
            self.turns.spawn(self._learn(txn, exc.outcome))

    async def _learn(self, txn: Transaction, outcome: Awaitable[bool]) -> None:
        """Wait for the outcome of a commit in doubt; return its acks if none of it applied. If
        the store stops first, the acks stay pending: the replica's reaper completes a record it
        left before returning what it held."""
        try:
            applied = await outcome
        finally:
            self.in_doubt.pop(txn.id, None)
        if applied:
            self._committed(txn)
        else:
            await self.rollback(txn)

    def _committed(self, txn: Transaction) -> None:
        for address in {address for address, _, _ in txn.sends}:
            self.nodes.kick(address)

    async def rollback(self, txn: Transaction) -> None:
        """Drop the sends; return the acked entries (delivery-count + 1, a new transfer)."""
        returned: list[Awaitable[None]] = [
            self.returns.redeliver(address, group, entry, delivery_failed=True)
            for address, group, entry in txn.acks
        ]
        txn.sends.clear()
        txn.acks.clear()
        for future in returned:
            try:
                await future
            except BrokerError as exc:  # still pending in Redis: the reaper returns it later
                logger.warning('rollback could not return an entry yet: %s', exc)

    def coordinator_gone(self, link: CoordinatorLink) -> None:
        """Session or connection ended with transactions open: they roll back."""
        for txn in list(link.transactions.values()):
            self.open.pop(txn.id, None)
            self.turns.spawn(self.rollback(txn))
        link.transactions.clear()

    def held(self, address: str, group: str) -> set[tuple[int, str]]:
        """Entries acknowledged inside open transactions, or ones whose commit is in doubt:
        pending on purpose until discharge, or until the outcome is known."""
        return {
            entry.key
            for txn in itertools.chain(
                self.open.values(), self.committing.values(), self.in_doubt.values()
            )
            for a, g, entry in txn.acks
            if a == address and g == group
        }

    def find(self, txn_id: bytes | None) -> Transaction | None:
        return self.open.get(txn_id) if txn_id is not None else None


def _reject(delivery: Ptr, error: BrokerError) -> None:
    local = lib.pn_delivery_local(delivery)
    engine.set_condition(lib.pn_disposition_condition(local), error.condition, str(error))
    lib.pn_delivery_update(delivery, lib.PN_REJECTED)
    lib.pn_delivery_settle(delivery)
