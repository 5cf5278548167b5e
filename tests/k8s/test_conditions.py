"""The pure status side: conditions, Ready summaries, the sampling throttle, deletion hatches,
and what a SharedSubscription means to the broker."""

import dataclasses
import datetime
from typing import Any

import pytest

from shoal_broker.routing.jms_subscriptions import Scope
from shoal_broker.routing.policies import EntityPolicy
from shoal_broker.store.declarations import EntityState, RedisInfo
from shoal_operator import conditions, entities, provisioning, status
from shoal_operator.models import BrokerCluster, DeletionPolicy, InvalidSpec, SharedSubscription

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def test_last_transition_time_moves_only_when_the_status_flips() -> None:
    first = conditions.make_condition('Ready', True, reason='A', generation=1, previous=[], now=T0)
    same = conditions.make_condition('Ready', True, reason='B', generation=2, previous=[first],
                                     now=T1)  # fmt: skip
    flipped = conditions.make_condition('Ready', False, reason='C', generation=2, previous=[same],
                                        now=T1)  # fmt: skip
    assert first['lastTransitionTime'] == '2026-01-01T12:00:00Z'
    assert (same['lastTransitionTime'], same['reason'], same['observedGeneration']) == (
        '2026-01-01T12:00:00Z', 'B', 2)  # fmt: skip
    assert flipped['lastTransitionTime'] == '2026-01-01T12:05:00Z'
    unknown = conditions.make_condition('X', None, reason='R', generation=1, previous=[], now=T0)
    assert unknown['status'] == 'Unknown'


def test_merged_replaces_by_type_and_keeps_the_rest_sorted() -> None:
    a = conditions.make_condition('B', True, reason='r', generation=1, previous=[], now=T0)
    b = conditions.make_condition('A', True, reason='r', generation=1, previous=[], now=T0)
    c = conditions.make_condition('B', False, reason='s', generation=1, previous=[], now=T0)
    merged = conditions.merged([a, b], [c])
    assert [(x['type'], x['status']) for x in merged] == [('A', 'True'), ('B', 'False')]
    assert conditions.without(merged, 'A') == [c]
    assert conditions.is_true(merged, 'A')
    assert not conditions.is_true(merged, 'B')


def test_ready_is_false_with_the_first_blocker_as_its_reason() -> None:
    blocked = conditions.ready([('RedisUnavailable', 'down'), ('Other', 'x')], generation=1,
                               previous=[], now=T0, ok_reason='Ok')  # fmt: skip
    assert (blocked['status'], blocked['reason'], blocked['message']) == (
        'False', 'RedisUnavailable', 'down')  # fmt: skip
    fine = conditions.ready([], generation=1, previous=[], now=T0, ok_reason='Ok')
    assert (fine['status'], fine['reason']) == ('True', 'Ok')


def by_type(conds: list[Any]) -> dict[str, dict[str, Any]]:
    return {c['type']: c for c in conds}


@pytest.mark.parametrize(('problem', 'provisioned', 'expected'), [
    (None, ('Provisioned', ''), {'Ready': ('True', 'Provisioned'),
                                 'Provisioned': ('True', 'Provisioned'),
                                 'ClusterAvailable': ('True', 'ClusterReachable')}),
    (('ClusterNotFound', 'no'), None, {'Ready': ('False', 'ClusterNotFound'),
                                       'ClusterAvailable': ('False', 'ClusterNotFound')}),
    (('InvalidSelector', 'bad'), None, {'Ready': ('False', 'InvalidSelector'),
                                        'Provisioned': ('False', 'InvalidSelector'),
                                        'ClusterAvailable': ('True', 'ClusterReachable')}),
])  # fmt: skip
def test_entity_conditions(
    problem: tuple[str, str] | None,
    provisioned: tuple[str, str] | None,
    expected: dict[str, tuple[str, str]],
) -> None:
    conds = by_type(status.entity_conditions(generation=4, previous=[], now=T0, problem=problem,
                    provisioned=provisioned, paused=False, observe_only=False))  # fmt: skip
    for type_, (state, reason) in expected.items():
        assert (conds[type_]['status'], conds[type_]['reason']) == (state, reason), type_
        assert conds[type_]['observedGeneration'] == 4
    assert conds['ReconcilePaused']['status'] == 'False'


def test_a_paused_entity_says_so_and_stays_ready() -> None:
    conds = by_type(status.entity_conditions(generation=1, previous=[], now=T0, problem=None,
                    provisioned=None, paused=True, observe_only=False))  # fmt: skip
    assert conds['ReconcilePaused']['status'] == 'True'
    assert (conds['Ready']['status'], conds['Ready']['reason']) == ('True', 'ReconcilePaused')


def test_the_limit_condition_waits_for_the_handler_to_answer_a_resume_or_a_spec_change() -> None:
    """The observer's ``ConsumersAtLimit`` write replaces the conditions list whole, so it is
    made only from a list the handler has brought up to date; otherwise a list read before the
    handler's write could land after it and undo it (a resumed subscription left paused)."""

    def sub(paused_condition: bool, paused: bool, generation: int = 2) -> dict[str, Any]:
        previous = status.entity_conditions(generation=2, previous=[], now=T0, problem=None,
                                            provisioned=None, paused=paused_condition,
                                            observe_only=False)  # fmt: skip
        annotations = {'shoal.dev/paused': 'true'} if paused else {}
        return {'metadata': {'name': 's', 'namespace': 'default', 'generation': generation,
                             'annotations': annotations},
                'spec': {'clusterRef': {'name': 'shoal'}, 'topic': 't', 'subscriptionName': 's',
                         'maxConsumers': 2},
                'status': {'observedGeneration': 2, 'conditions': previous}}  # fmt: skip

    written = entities.limit_conditions(sub(paused_condition=False, paused=False), False)
    assert written is not None
    assert by_type(written)['ConsumersAtLimit']['status'] == 'False'
    assert by_type(written)['ReconcilePaused']['status'] == 'False'
    # resumed, the handler's write not in yet: nothing written
    assert entities.limit_conditions(sub(paused_condition=True, paused=False), False) is None
    # paused: the pause's conditions stay
    assert entities.limit_conditions(sub(paused_condition=True, paused=True), False) is None
    # a spec change the handler has not observed
    assert entities.limit_conditions(sub(False, paused=False, generation=3), False) is None


def cluster(**spec: Any) -> BrokerCluster:
    return BrokerCluster.from_body({'metadata': {'name': 'c', 'generation': 2},
                                    'spec': {'redis': {'secretName': 's'}, 'replicas': 2,
                                             'auth': {'usersSecretName': 'users'}, **spec}},
                                   default_image='i')  # fmt: skip


def test_cluster_status_from_the_deployment_and_redis() -> None:
    deployment = {'status': {'replicas': 2, 'readyReplicas': 2, 'updatedReplicas': 2}}
    ok = status.cluster_status(
        cluster(),
        deployment=deployment,
        redis=RedisInfo(0.4, '7.0.15'),
        redis_error='',
        declared_subscriptions=3,
        previous=[],
        now=T0,
    )
    conds = by_type(ok['conditions'])
    assert conds['Ready']['status'] == 'True'
    assert conds['Progressing']['status'] == 'False'
    # a new pod template the Deployment's controller has not seen yet is a rollout too
    template_changed = {'metadata': {'generation': 4},
                        'status': {**deployment['status'], 'observedGeneration': 3}}  # fmt: skip
    rolling = status.cluster_status(cluster(), deployment=template_changed,
                                    redis=RedisInfo(0.4, '7.0.15'), redis_error='',
                                    declared_subscriptions=3, previous=[], now=T0)  # fmt: skip
    assert by_type(rolling['conditions'])['Progressing']['reason'] == 'RollingOut'
    assert ok['redis'] == {'connected': True, 'latencyMs': 0.4, 'serverVersion': '7.0.15'}
    assert (ok['replicas'], ok['readyReplicas'], ok['subscriptions']) == (2, 2, {'declared': 3})
    down = status.cluster_status(cluster(), deployment={'status': {'replicas': 2}}, redis=None,
                                 redis_error='refused', declared_subscriptions=None,
                                 previous=ok['conditions'], now=T1)  # fmt: skip
    conds = by_type(down['conditions'])
    assert (conds['Ready']['status'], conds['Ready']['reason']) == ('False', 'RedisUnavailable')
    assert conds['RedisConnected']['message'] == 'refused'
    assert conds['Progressing']['status'] == 'True'
    assert conds['Ready']['lastTransitionTime'] == '2026-01-01T12:05:00Z'


def test_a_missing_secret_keeps_a_cluster_from_being_ready() -> None:
    deployment = {'status': {'replicas': 2, 'readyReplicas': 2, 'updatedReplicas': 2}}
    missing = [
        ('SecretMissing', 'Secret default/users (spec.auth.usersSecretName) does not exist'),
        ('SecretKeyMissing', 'Secret default/tls (spec.tls.secretName) has no key tls.key'),
    ]

    def observe(redis: RedisInfo | None, problems: list[tuple[str, str]]) -> dict[str, Any]:
        found = status.cluster_status(cluster(), deployment=deployment, redis=redis,
                                      redis_error='refused', declared_subscriptions=None,
                                      previous=[], now=T0, secret_problems=problems)  # fmt: skip
        return by_type(found['conditions'])

    conds = observe(RedisInfo(0.4, '7.0.15'), missing)
    assert (conds['Ready']['status'], conds['Ready']['reason']) == ('False', 'SecretMissing')
    assert conds['Ready']['message'] == missing[0][1]
    assert (conds['SecretsFound']['status'], conds['SecretsFound']['reason']) == (
        'False', 'SecretMissing'
    )  # fmt: skip
    assert conds['SecretsFound']['message'].split('; ') == [message for _, message in missing]
    # Ready names the first problem; the others stay visible on SecretsFound
    conds = observe(None, missing[1:])
    assert conds['Ready']['reason'] == 'RedisUnavailable'
    assert conds['SecretsFound']['reason'] == 'SecretKeyMissing'
    conds = observe(RedisInfo(0.4, '7.0.15'), [])
    assert (conds['SecretsFound']['status'], conds['Ready']['status']) == ('True', 'True')


def subscription(**spec: Any) -> SharedSubscription:
    return SharedSubscription.from_body(
        {
            'metadata': {'name': 's', 'namespace': 'team'},
            'spec': {
                'clusterRef': {'name': 'c'},
                'topic': 't',
                'subscriptionName': 'audit',
                **spec,
            },
        }
    )


def test_live_status_and_the_throttle() -> None:
    state = EntityState(exists=True, consumers=2, consumer_replicas=2, backlog=100,
                        oldest_age_seconds=3.0)  # fmt: skip
    live = status.subscription_live(subscription(maxConsumers=2), state, T0)
    assert live['consumers'] == {'active': 2, 'replicas': 2, 'max': 2}
    assert live['backlog']['messages'] == 100
    assert status.at_limit(subscription(maxConsumers=2), state) is True
    assert status.at_limit(subscription(), state) is None
    moved = {**live, 'backlog': {**live['backlog'], 'messages': 105}}
    assert not status.worth_writing(live, moved)  # 5 % is noise
    assert status.worth_writing(live, {**live, 'backlog': {'messages': 0}})
    assert status.worth_writing(live, {**live, 'backlog': {**live['backlog'], 'messages': 150}})
    assert status.worth_writing(live, {**live, 'consumers': {'active': 1, 'replicas': 1}})
    assert status.worth_writing({}, live)


def test_a_subscription_maps_to_the_broker_key_and_link_name() -> None:
    global_sub = subscription()
    assert provisioning.subscription_key(global_sub).id == 'durable:global:*:audit'
    assert global_sub.link_name == 'audit|global'
    mine = subscription(scope='ClientId', clientId='app-1')
    key = provisioning.subscription_key(mine)
    assert (key.scope, key.client_id, key.id) == (
        Scope.CLIENT,
        'app-1',
        'durable:client:app-1:audit',
    )
    assert mine.link_name == 'audit'
    volatile = subscription(durable=False, deletionPolicy='Delete')
    assert provisioning.subscription_key(volatile).id == 'volatile:global:*:audit'
    declared = provisioning.declaration(subscription(selector="a = 'x'", maxConsumers=3))
    assert (declared.owner, declared.selector, declared.max_consumers) == ('team/s', "a = 'x'", 3)


@pytest.mark.parametrize(('spec', 'message'), [
    ({'selector': 'a = = 1'}, 'invalid selector'),
    ({'scope': 'ClientId'}, 'clientId is required'),
    ({'durable': False}, 'non-durable'),
    ({'subscriptionName': 'a|b'}, 'without |'),
])  # fmt: skip
def test_specs_the_broker_would_refuse_are_invalid(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        provisioning.declaration(subscription(**spec))


def context(**changes: Any) -> provisioning.DeletionContext:
    base: dict[str, Any] = {'policy': DeletionPolicy.DELETE, 'force': False, 'paused': False,
                            'cluster_present': True, 'unreachable_since': None,
                            'timeout_seconds': 600}  # fmt: skip
    return provisioning.DeletionContext(**{**base, **changes})


def test_the_escape_hatches_release_a_finalizer_without_touching_redis() -> None:
    assert provisioning.escape_hatch(context(), T0) is None
    assert provisioning.escape_hatch(context(force=True), T0) is provisioning.Release.FORCED
    assert provisioning.escape_hatch(context(paused=True), T0) is provisioning.Release.PAUSED
    assert provisioning.escape_hatch(
        context(cluster_present=False), T0) is provisioning.Release.CLUSTER_GONE  # fmt: skip
    waiting = context(unreachable_since=T0)
    assert provisioning.escape_hatch(waiting, T0 + datetime.timedelta(seconds=599)) is None
    assert (
        provisioning.escape_hatch(waiting, T0 + datetime.timedelta(seconds=600))
        is provisioning.Release.REDIS_TIMEOUT
    )


def test_the_live_status_shows_each_replicas_consumers_and_share_of_the_deliveries() -> None:
    state = EntityState(exists=True, consumers=2, consumer_replicas=1,
                        consumers_per_replica={'replica-a': 2},
                        delivered={'replica-a': 30, 'replica-b': 10})  # fmt: skip
    live = status.subscription_live(subscription(), state, T0)
    assert live['consumers']['perReplica'] == [
        {'replica': 'replica-a', 'consumers': 2, 'delivered': 30, 'deliveredShare': 0.75},
        {'replica': 'replica-b', 'consumers': 0, 'delivered': 10, 'deliveredShare': 0.25},
    ]
    idle = status.subscription_live(subscription(), EntityState(exists=True), T0)
    assert 'perReplica' not in idle['consumers']


def test_the_oldest_message_age_is_written_on_a_coarse_scale() -> None:
    """A waiting message's age moves the status only when it reaches its next step, so a queue
    holding one for a day is rewritten a dozen times, not once a minute."""
    assert [status.coarse_age(s) for s in (0, 9.9, 10, 59, 61, 299, 3599, 3600, 90000)] == [
        0, 0, 10, 30, 60, 120, 1800, 3600, 86400,
    ]  # fmt: skip
    assert status.coarse_age(20 * 86400) == 14 * 86400  # whole weeks past a week
    state = EntityState(exists=True, backlog=1, oldest_age_seconds=61.0)
    live = status.subscription_live(subscription(), state, T0)
    later = status.subscription_live(subscription(), dataclasses.replace(
        state, oldest_age_seconds=119.0), T0)  # fmt: skip
    assert not status.worth_writing(live, later)
    steps = {status.coarse_age(s) for s in range(0, 86401, 5)}  # a day's wait
    assert len(steps) - 1 == 12  # moves after the first write
    moved = status.subscription_live(subscription(), dataclasses.replace(
        state, oldest_age_seconds=120.0), T0)  # fmt: skip
    assert status.worth_writing(live, moved)


def test_the_live_status_shows_an_exclusive_entitys_active_and_standby_consumers() -> None:
    line = ('replica-a/c1|orders-rx', 'replica-b/c7|orders-rx', 'replica-a/c2|orders-rx')
    live = status.subscription_live(subscription(), EntityState(exists=True, line=line), T0)
    assert live['exclusive'] == {
        'active': 'replica-a/c1|orders-rx',
        'standby': ['replica-b/c7|orders-rx', 'replica-a/c2|orders-rx'],
    }
    declared = EntityState(exists=True, policy=EntityPolicy(exclusive=True))
    idle = status.subscription_live(subscription(), declared, T0)
    assert idle['exclusive'] == {'active': None, 'standby': []}  # cleared on a merge patch
    assert 'exclusive' not in status.subscription_live(subscription(), EntityState(exists=True), T0)


def test_an_exclusive_line_is_written_when_it_changes_and_removed_when_it_goes() -> None:
    line = ('replica-a/c1|orders-rx', 'replica-b/c7|orders-rx')
    shown = status.subscription_live(subscription(), EntityState(exists=True, line=line), T0)
    # the next in line takes over, the backlog unchanged: written all the same
    taken_over = status.subscription_live(
        subscription(), EntityState(exists=True, line=line[1:]), T0
    )
    assert status.worth_writing(shown, taken_over)
    assert not status.worth_writing(shown, dict(shown))
    # exclusive by the brokers' SHOAL_EXCLUSIVE_ADDRESSES alone, its consumers gone: the line
    # goes from the status rather than showing a consumer that left
    gone = status.subscription_live(subscription(), EntityState(exists=True), T0)
    assert 'exclusive' not in gone
    assert status.worth_writing(shown, gone)
    assert status.as_patch(shown, gone, optional=status.LIVE_OPTIONAL)['exclusive'] is None
    assert not status.worth_writing(gone, dict(gone))
