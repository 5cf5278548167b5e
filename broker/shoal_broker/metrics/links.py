"""
``shoal_consumer_deliveries{address,subscription,link}``: transfers sent on each attached
consumer link, for at most ``cap_consumer_link_series`` links; the rest count under
``link="_other"``. A link's counter is an attribute raised on the per-message path.
"""

from prometheus_client.core import CounterMetricFamily

from shoal_broker.metrics.labels import OTHER_ADDRESSES, folded, subscription_label

OTHER_LINKS = '_other'
"""The ``link`` label of the deliveries of consumer links past the per-replica cap."""

LINK_LABEL_LENGTH = 256
"""Characters of a link name kept in its ``link`` label (AMQP allows names as long as a frame)."""

LINK_DELIVERIES_NAME = 'shoal_consumer_deliveries'
LINK_DELIVERIES_HELP = (
    'Transfers sent on each consumer link attached to this replica, by AMQP link name. A series '
    'lives as long as its link: it is dropped when the link detaches (a reattached consumer starts '
    'a new series from 0). Past the per-replica cap (SHOAL_METRICS_MAX_CONSUMER_LINKS), and for a '
    'name another attached link of the subscription already has, links count under '
    'link="_other", which keeps the deliveries of its detached links.'
)


class LinkDeliveries:
    """What one consumer link was sent: ``count`` is raised on the per-message path (an attribute
    increment), read at scrape time."""

    __slots__ = ('address', 'count', 'link', 'subscription')

    def __init__(self, address: str = '', subscription: str = '', link: str = OTHER_LINKS) -> None:
        self.address = address
        self.subscription = subscription
        self.link = link
        self.count = 0


_link_cap = 200
_LINKS: dict[tuple[str, str, str], LinkDeliveries] = {}
"""(address, subscription, link) label values -> the attached link with a series of its own."""
_FOLDED: set[LinkDeliveries] = set()
"""Attached links counted under ``link="_other"``."""
_FOLDED_GONE: dict[tuple[str, str], int] = {}
"""(address, subscription) -> deliveries of detached links that counted under ``_other``."""


def cap_consumer_link_series(cap: int) -> None:
    """Give at most ``cap`` attached consumer links a series of their own (0: no cap)."""
    global _link_cap
    _link_cap = cap


def link_attached(address: str, group: str, name: str) -> LinkDeliveries:
    """The counter of a consumer link that attached: a series of its own while fewer than the
    cap's links have one and its name is free, else one of ``_other``'s for its whole life
    (so no count ever moves between series)."""
    address, label = folded(('address', 'subscription'), (address, subscription_label(group)))
    key = (address, label, name[:LINK_LABEL_LENGTH])
    room = not _link_cap or len(_LINKS) < _link_cap
    free = key not in _LINKS and key[2] != OTHER_LINKS  # a link named "_other" joins it
    if room and free and address != OTHER_ADDRESSES:
        deliveries = _LINKS[key] = LinkDeliveries(*key)
    else:
        deliveries = LinkDeliveries(address, label)
        _FOLDED.add(deliveries)
    return deliveries


def link_detached(deliveries: LinkDeliveries) -> None:
    """Drop the series of a detached link; ``_other`` keeps what its folded links were sent."""
    key = (deliveries.address, deliveries.subscription, deliveries.link)
    if _LINKS.get(key) is deliveries:
        del _LINKS[key]
    elif deliveries in _FOLDED:
        _FOLDED.discard(deliveries)
        pair = (deliveries.address, deliveries.subscription)
        _FOLDED_GONE[pair] = _FOLDED_GONE.get(pair, 0) + deliveries.count


def link_deliveries_family() -> CounterMetricFamily:
    family = CounterMetricFamily(
        LINK_DELIVERIES_NAME, LINK_DELIVERIES_HELP, labels=['address', 'subscription', 'link']
    )
    for key, deliveries in list(_LINKS.items()):
        family.add_metric(list(key), deliveries.count)
    folded = dict(_FOLDED_GONE)
    for deliveries in list(_FOLDED):
        pair = (deliveries.address, deliveries.subscription)
        folded[pair] = folded.get(pair, 0) + deliveries.count
    for (address, subscription), count in folded.items():
        family.add_metric([address, subscription, OTHER_LINKS], count)
    return family
