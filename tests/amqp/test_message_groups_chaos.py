"""The acceptance run of message groups: 200 groups x 50 messages, 4 consumers over 2 replicas,
producers on both, one replica killed with SIGKILL mid-run (docs/architecture.md, "Message
groups"). Runs on whichever store the suite runs on (SHOAL_TEST_STORE)."""

import signal
import time
from collections.abc import Callable

import pytest
from groupsrun import GroupsRun
from processes import BrokerProcess

FAST_LEASE = {'SHOAL_LEASE_SECONDS': '1.5'}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_groups_hold_order_and_move_when_a_replica_is_killed(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    survivor, doomed = start_broker(env=FAST_LEASE), start_broker(env=FAST_LEASE)
    consumers = [survivor.url, doomed.url, survivor.url, doomed.url]
    run = GroupsRun([survivor.url, doomed.url], consumers, address, groups=200, per_group=50,
                    pause=0.002)  # fmt: skip

    def kill_mid_run(r: GroupsRun) -> None:
        # the producers (on both) are done: one on the killed replica would leave a send in
        # doubt, sent again out of its group's order
        deadline = time.monotonic() + 120
        while r.distinct() < 3000 and time.monotonic() < deadline:
            time.sleep(0.02)

        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait(timeout=5)

    run.run(kill_mid_run, timeout=200, prefill=True)
    assert run.distinct() == 200 * 50, f'sent {run.sent}'
    wrong = run.violations(dead={1, 3})
    assert wrong == [], '\n'.join(wrong)
    moved = [g for g, got in run.by_group().items() if len({r.consumer for r in got}) > 1]
    assert moved, 'the killed replica held groups'


@pytest.mark.timeout(120)
def test_groups_hold_order_over_two_replicas_with_producers_on_both(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    consumers = [broker.url, second_broker.url, broker.url, second_broker.url]
    run = GroupsRun([broker.url, second_broker.url], consumers, address, groups=50,
                    per_group=20)  # fmt: skip
    run.run(lambda r: None, timeout=90)
    assert run.distinct() == 50 * 20
    assert run.violations(dead=set()) == []
    assert len({r.consumer for r in run.ledger}) == 4, 'every consumer took groups'
