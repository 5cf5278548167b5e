"""
Which subscriptions fetch in bulk: their priority-4 band read by a plain ``XREADGROUP`` beside
``fetch.lua`` (``Messages._fetch_op``), since an entry handed back through Lua costs Redis ~3 µs
more and the script answers such a fetch from four reads at most
(docs/performance.md#bulk-fetch). The rule lives apart from the fetch's commands so that
``messages.py`` keeps to building and reading them.
"""

BULK_FETCH_ENTRIES = 2
"""A fetch this big, with nothing but new priority-4 entries in it, makes the next fetches of
its subscription go in bulk, until one hands out anything else or comes back short and smaller.
An empty fetch says nothing (under load it finds the stream just drained), nor does a full small
one (it was asked for little: credit). A fetch of one entry at a trickle stays one script call:
the pair costs the broker more there than it saves Redis."""

MAX_BULK_FETCHES = 10_000
"""Bound on the subscriptions remembered as fetching in bulk: a full set is cleared, so
subscriptions deleted meanwhile do not keep the new ones out."""

Subscription = tuple[str, str]
"""(address, group)."""


class BulkFetches:
    """The subscriptions fetching in bulk. One other replicas serve too is never among them
    (only the script knows this replica's share): a fetch the sharing rule answered takes it out
    (``judge``'s ``other``)."""

    def __init__(self) -> None:
        self._bulk: set[Subscription] = set()

    def in_bulk(self, subscription: Subscription) -> bool:
        return subscription in self._bulk

    def judge(
        self, subscription: Subscription, other: bool, handed: int, count: int, bulk: bool
    ) -> None:
        """Whether the next fetches of ``subscription`` go in bulk, after a fetch of ``count``
        that went in bulk or not (``bulk``) and handed out ``handed`` entries: not when it handed
        out anything but new priority-4 entries or was shared with other replicas (``other``),
        or came back short and smaller; yes when it handed out ``BULK_FETCH_ENTRIES`` or more."""
        if other or 0 < handed < min(count, BULK_FETCH_ENTRIES):
            self._bulk.discard(subscription)
        elif handed >= BULK_FETCH_ENTRIES and not bulk:
            if len(self._bulk) >= MAX_BULK_FETCHES:
                self._bulk.clear()
            self._bulk.add(subscription)
