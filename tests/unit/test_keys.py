"""Key names the store builds and reads back: a notification channel names its address."""

import pytest

from shoal_broker.store import keys


@pytest.mark.parametrize('address', ['orders', 'a:b}{c', 'ünïcode/queue', ''])
def test_a_notify_channel_names_its_address(address: str) -> None:
    channel = keys.AddressKeys.of(address).notify.encode()
    assert keys.notified_address(channel) == address


@pytest.mark.parametrize(
    'channel',
    [
        keys.replica_channel('replica-1').encode(),
        keys.AddressKeys.of('orders').watchers.encode(),
        b'other:{a:orders}:notify',
    ],
)
def test_other_channels_name_no_address(channel: bytes) -> None:
    assert keys.notified_address(channel) is None


def test_the_analytics_summary_key_stays_what_running_jobs_write() -> None:
    # an analytics job and an operator of different releases meet at this key
    assert keys.ANALYTICS_SUMMARY == 'shoal:analytics:summary'


@pytest.mark.parametrize('address', ['orders', 'a:b}{c'])
def test_the_backlog_probe_names_the_keys_the_address_has(address: str) -> None:
    k = keys.AddressKeys.of(address)
    stream, others = keys.probed_keys(address, 5, ['queue', 'sub-1'])
    assert stream == k.streams[5]
    assert others == [k.levels, k.body_index, k.returned('queue'), k.returned('sub-1')]
    assert all(name.startswith(keys.address_tag(address)) for name in [stream, *others])
