"""
Queue browsers: a non-destructive, settled view of what a queue holds, served as credit comes.

One browse at a time per link (``busy``; credit arriving meanwhile sets ``again``); each reads
from the link's cursor up to its credit, applies its selector here, and answers a drain once the
queue has nothing more for it.
"""

import asyncio
import logging
from typing import Any

from shoal_broker.amqp.engine import lib
from shoal_broker.amqp.links import BrowserLink, Identifiers
from shoal_broker.amqp.subscriptions import MAX_FETCH
from shoal_broker.amqp.turns import Turns
from shoal_broker.errors import BrokerError
from shoal_broker.routing.storage import QUEUE_GROUP, MessageStore

logger = logging.getLogger(__name__)


class Browsing:
    def __init__(self, store: MessageStore, turns: Turns) -> None:
        self.store = store
        self.turns = turns
        self.browsers: dict[str, set[BrowserLink]] = {}

    def add_browser(self, browser: BrowserLink) -> None:
        watchers = self.browsers.setdefault(browser.address, set())
        watchers.add(browser)
        self.browse(browser)

    def browser_gone(self, browser: BrowserLink) -> None:
        self.browsers.get(browser.address, set()).discard(browser)

    def browse(self, browser: BrowserLink) -> None:
        if browser.busy:
            browser.again = True
            return
        credit = lib.pn_link_credit(browser.ptr) if browser.alive and browser.opened else 0
        if credit <= 0:
            return
        browser.busy, browser.again = True, False
        asked = min(credit, MAX_FETCH)
        future = self.store.messages.browse(browser.address, QUEUE_GROUP, browser.cursor, asked)
        future.add_done_callback(  # type: ignore[attr-defined]
            lambda f: self._browsed(browser, asked, f)
        )

    def _browsed(self, browser: BrowserLink, asked: int, future: asyncio.Future[Any]) -> None:
        browser.busy = False
        if not browser.alive:
            return
        try:
            entries, cursor = future.result()
        except BrokerError as exc:
            logger.warning('browse of %s failed: %s', browser.address, exc)
            entries, cursor = [], browser.cursor
        browser.cursor = cursor
        identifiers = Identifiers()
        selector = browser.selector
        browser.send(e for e in entries if selector is None or selector.matches(identifiers.of(e)))
        if len(entries) >= asked or browser.again:
            self.browse(browser)
        elif lib.pn_link_get_drain(browser.ptr):
            lib.pn_link_drained(browser.ptr)
        self.turns.mark_dirty(browser.conn)
