"""Who may do what (tasks/access/permissions.py): roles as groups, grants per task (guardian) or per project/kind
(ScopeGrant), admins only for grants and forced releases — each rule tried against what should break it.
A refusal changes nothing and writes no audit row."""

import io
import re
import threading
from collections.abc import Callable
from functools import partial

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection

from audit.models import AuditEvent
from audit.principals import Principal
from leases.models import ForcedRelease, Lease
from leases.services import lease_open, lease_release
from tasks.access.accounts import (
    RoleRefused,
    account_create,
    account_password_reset,
    admin_bootstrap,
    role_grant,
    role_revoke,
)
from tasks.access.permissions import (
    ADMIN,
    AUDITOR,
    OPERATOR,
    GrantRefused,
    PermissionDenied,
    can_view,
    has_role,
    operable_condition,
    permission_grant,
    permission_revoke,
    viewable_condition,
)
from tasks.access.permissions import can_operate as can_operate_task
from tasks.engine.protocol import next_directive, operation_start, snapshot_at
from tasks.models import ScopeGrant, Task
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import forced_release_review, lease_force_release
from tasks.people.settlement import operation_settle_by_hand
from tasks.people.takeover import (
    takeover_claim,
    takeover_release,
    takeover_submit,
)
from tests.conftest import chain_plan, person, snapshot

pytestmark = pytest.mark.django_db

JUSTIFICATION = "agent worker-7 has been wedged for an hour"
IMPACT = "its in-flight copy is reconciled by op key afterwards"
REVIEW_NOTE = "agreed: the worker was stuck and nothing was lost"


def deactivate(who: Principal) -> None:
    who.user.is_active = False
    who.user.save(update_fields=["is_active"])


def current(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def refused(action: Callable[[], object]) -> None:
    """``action`` raises PermissionDenied, changes nothing and writes no audit row."""
    before, audited = snapshot(), AuditEvent.objects.count()
    with pytest.raises(PermissionDenied):
        action()
    assert AuditEvent.objects.count() == audited
    assert snapshot() == before


def claims(who: Principal, task: Task) -> Lease:
    claim = takeover_claim(actor=who, task_id=task.pk)
    assert claim.granted and claim.lease is not None
    return claim.lease


def can_operate(who: Principal, task: Task) -> bool:
    """Claim and give back: True if the takeover was granted, False if refused (refusals change nothing)."""
    try:
        lease = claims(who, task)
    except PermissionDenied:
        return False
    takeover_release(actor=who, lease=lease)
    return True


@pytest.fixture
def root() -> Principal:
    return person("root", "admin")


@pytest.fixture
def ann() -> Principal:
    return person("ann", "operator")


# --- an operator without a grant --------------------------------------------------------------------------------


def test_an_operator_without_a_grant_cannot_take_a_task_over(make_task, clock, ann) -> None:
    task = make_task(project="billing", kind="migrate")
    refused(lambda: takeover_claim(actor=ann, task_id=task.pk))


def test_an_operator_whose_grant_was_revoked_cannot_submit_a_result(make_task, clock, root, ann) -> None:
    task = make_task(chain_plan("a"))
    permission_grant(actor=root, user=ann.user, task=task)
    lease = claims(ann, task)
    permission_revoke(actor=root, user=ann.user, task=task)
    version = current(task).version
    refused(
        lambda: takeover_submit(
            actor=ann, lease=lease, based_on_version=version, decision="end_task", end_status="failed", note="gave up"
        )
    )


def test_an_operator_whose_grant_was_revoked_cannot_settle_an_operation(make_task, agent_lease, clock, root, ann):
    task = make_task(chain_plan("a"))
    agent = agent_lease(task)
    d = next_directive(task_id=task.pk, lease=agent)
    op = operation_start(
        snapshot_at(task_id=task.pk, lease=agent, expected_version=d.task_version), "a", lease=agent
    ).operation
    lease_release(lease=agent)
    permission_grant(actor=root, user=ann.user, task=task)
    claims(ann, task)
    permission_revoke(actor=root, user=ann.user, task=task)
    version = current(task).version
    refused(
        lambda: operation_settle_by_hand(
            actor=ann,
            task_id=task.pk,
            op_key=op.op_key,
            expected_version=version,
            resolution="not_done",
            note="nothing in the remote's history",
        )
    )


def test_an_operator_without_a_grant_cannot_cancel(make_task, clock, ann) -> None:
    task = make_task(project="billing", kind="migrate")
    nobody = person("nobody")
    refused(lambda: task_request_cancel(actor=Principal.of_user(ann.user), task_id=task.pk, reason="not needed"))
    refused(lambda: task_request_cancel(actor=Principal.of_user(nobody.user), task_id=task.pk, reason="not needed"))


# --- grants: one task, a project, a kind ------------------------------------------------------------------------


def test_a_grant_on_one_task_lets_the_operator_operate_that_task_and_no_other(make_task, clock, root, ann) -> None:
    granted = make_task(project="billing", kind="migrate")
    sibling = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=ann.user, task=granted)
    later = make_task(project="billing", kind="migrate")
    assert can_operate(ann, granted)
    assert not can_operate(ann, sibling)
    assert not can_operate(ann, later)
    refused(lambda: task_request_cancel(actor=ann, task_id=sibling.pk, reason="not needed"))
    task_request_cancel(actor=ann, task_id=granted.pk, reason="not needed")
    assert current(granted).cancel_requested_by == "user:ann"


def test_a_project_grant_covers_every_task_of_the_project_even_later_ones(make_task, clock, root, ann) -> None:
    before = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=ann.user, project="billing")
    after = make_task(project="billing", kind="export")
    assert can_operate(ann, before)
    assert can_operate(ann, after)
    for project in ("billing-eu", "Billing", "", "ledger"):
        assert not can_operate(ann, make_task(project=project, kind="migrate")), project


def test_a_kind_grant_covers_every_task_of_the_kind_even_later_ones(make_task, clock, root, ann) -> None:
    before = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=ann.user, kind="migrate")
    after = make_task(project="ledger", kind="migrate")
    no_project = make_task(project="", kind="migrate")
    assert can_operate(ann, before)
    assert can_operate(ann, after)
    assert can_operate(ann, no_project)
    for kind in ("migrate-fast", "Migrate", "export"):
        assert not can_operate(ann, make_task(project="billing", kind=kind)), kind


def test_a_project_and_kind_grant_needs_both_to_match(make_task, clock, root, ann) -> None:
    permission_grant(actor=root, user=ann.user, project="billing", kind="migrate")
    assert can_operate(ann, make_task(project="billing", kind="migrate"))
    assert not can_operate(ann, make_task(project="billing", kind="export"))
    assert not can_operate(ann, make_task(project="ledger", kind="migrate"))


def test_revoking_a_grant_takes_it_away(make_task, clock, root, ann) -> None:
    billing = make_task(project="billing", kind="export")
    migrate = make_task(project="ledger", kind="migrate")
    single = make_task(project="ledger", kind="export")
    permission_grant(actor=root, user=ann.user, project="billing")
    permission_grant(actor=root, user=ann.user, kind="migrate")
    permission_grant(actor=root, user=ann.user, task=single)
    assert all(can_operate(ann, t) for t in (billing, migrate, single))
    permission_revoke(actor=root, user=ann.user, project="billing")
    assert (can_operate(ann, billing), can_operate(ann, migrate), can_operate(ann, single)) == (False, True, True)
    permission_revoke(actor=root, user=ann.user, task=single)
    assert (can_operate(ann, billing), can_operate(ann, migrate), can_operate(ann, single)) == (False, True, False)
    permission_revoke(actor=root, user=ann.user, kind="migrate")
    assert not any(can_operate(ann, t) for t in (billing, migrate, single))
    assert not ScopeGrant.objects.filter(user=ann.user).exists()


def test_only_admins_grant_and_revoke(make_task, clock, root, ann) -> None:
    task = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=ann.user, project="billing")
    bob, carol = person("bob", "operator"), person("carol", "auditor")
    staff = person("sam", "operator", staff=True)
    for actor in (ann, bob, carol, staff, Principal.agent("agent-1"), Principal.system("scheduler")):
        refused(partial(permission_grant, actor=actor, user=bob.user, task=task))
        refused(partial(permission_grant, actor=actor, user=actor.user or bob.user, kind="migrate"))
        refused(partial(permission_revoke, actor=actor, user=ann.user, project="billing"))
    assert can_operate(ann, task)
    assert not can_operate(bob, task)


def test_grants_and_revocations_are_audited(make_task, clock, root, ann) -> None:
    task = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=ann.user, task=task)
    permission_grant(actor=root, user=ann.user, project="billing")
    permission_revoke(actor=root, user=ann.user, project="billing")
    permission_revoke(actor=root, user=ann.user, task=task)
    rows = list(
        AuditEvent.objects.order_by("seq").values_list("actor_kind", "actor_id", "action", "task_id", "details")
    )
    whom = {"user": "ann", "permission": "tasks.operate_task"}
    assert rows == [
        ("user", "root", "permission_granted", task.pk, {**whom, "task": task.pk}),
        ("user", "root", "permission_granted", None, {**whom, "project": "billing", "kind": "*"}),
        ("user", "root", "permission_revoked", None, {**whom, "project": "billing", "kind": "*"}),
        ("user", "root", "permission_revoked", task.pk, {**whom, "task": task.pk}),
    ]


def test_granting_everything_is_refused(make_task, clock, root, ann) -> None:
    before = snapshot()
    with pytest.raises(ValueError, match="everything"):
        permission_grant(actor=root, user=ann.user)
    with pytest.raises(ValueError, match="everything"):
        permission_grant(actor=root, user=ann.user, task=None, project="*", kind="*")
    with pytest.raises(ValueError, match="everything"):
        permission_revoke(actor=root, user=ann.user, task=None, project="*", kind="*")
    assert snapshot() == before
    assert not can_operate(ann, make_task(project="billing", kind="migrate"))


# --- roles and accounts -----------------------------------------------------------------------------------------


def test_an_auditor_cannot_operate_anything_even_with_grants(make_task, agent_lease, clock, root) -> None:
    carol = person("carol", "auditor")
    task = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=carol.user, task=task)
    permission_grant(actor=root, user=carol.user, project="billing")
    refused(lambda: takeover_claim(actor=carol, task_id=task.pk))
    refused(lambda: task_request_cancel(actor=carol, task_id=task.pk, reason="not needed"))
    agent_lease(task)
    refused(lambda: lease_force_release(actor=carol, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT))
    refused(lambda: permission_grant(actor=carol, user=carol.user, kind="migrate"))


def test_an_inactive_user_is_refused_even_with_grants(make_task, agent_lease, clock, root, ann) -> None:
    task = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=ann.user, task=task)
    permission_grant(actor=root, user=ann.user, project="billing")
    deactivate(ann)
    refused(lambda: takeover_claim(actor=ann, task_id=task.pk))
    refused(lambda: task_request_cancel(actor=ann, task_id=task.pk, reason="not needed"))
    former_admin, former_superuser = person("max", "admin"), person("sue", superuser=True)
    deactivate(former_admin)
    deactivate(former_superuser)
    agent_lease(task)
    for who in (former_admin, former_superuser):
        refused(partial(takeover_claim, actor=who, task_id=task.pk))
        refused(partial(lease_force_release, actor=who, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT))
        refused(partial(permission_grant, actor=who, user=ann.user, kind="migrate"))


def test_an_operator_who_holds_the_lease_is_refused_once_deactivated(make_task, clock, root, ann) -> None:
    task = make_task(chain_plan("a"))
    permission_grant(actor=root, user=ann.user, task=task)
    lease = claims(ann, task)
    deactivate(ann)
    version = current(task).version
    refused(
        lambda: takeover_submit(
            actor=ann, lease=lease, based_on_version=version, decision="end_task", end_status="failed", note="gave up"
        )
    )


def test_a_superuser_without_the_admin_group_is_not_an_admin(make_task, agent_lease, clock, root, ann) -> None:
    sue = person("sue", superuser=True, staff=True)
    task = make_task(project="billing", kind="migrate")
    assert not can_operate(sue, task)
    assert not has_role(sue, ADMIN)
    assert not Task.objects.filter(operable_condition(Principal.of_user(sue.user))).exists()
    assert not Task.objects.filter(viewable_condition(Principal.of_user(sue.user))).exists()
    refused(partial(permission_grant, actor=sue, user=ann.user, project="billing"))
    refused(partial(role_grant, actor=sue, user=sue.user, role=ADMIN))
    held = make_task(project="billing", kind="migrate")
    agent_lease(held)
    refused(partial(lease_force_release, actor=sue, task_id=held.pk, justification=JUSTIFICATION, impact=IMPACT))
    role_grant(actor=root, user=sue.user, role=ADMIN)  # the audited way in
    sue = Principal.of_user(User.objects.get(pk=sue.user.pk))
    forced = lease_force_release(actor=sue, task_id=held.pk, justification=JUSTIFICATION, impact=IMPACT)
    assert forced.forced_by == "user:sue"
    reviewed = forced_release_review(actor=root, forced_release_id=forced.pk, verdict="accepted", note=REVIEW_NOTE)
    assert reviewed.reviewed_by == "user:root"


# --- roles: granted and revoked by an admin, audited ------------------------------------------------------------


def memberships() -> list[tuple[str, str]]:
    return sorted(User.groups.through.objects.values_list("user__username", "group__name"))


def role_refused(action: Callable[[], object], error: type[Exception] = RoleRefused) -> None:
    """``action`` raises ``error`` and changes nothing: no membership, no row, no audit row."""
    before, groups, audited = snapshot(), memberships(), AuditEvent.objects.count()
    with pytest.raises(error):
        action()
    assert (snapshot(), memberships(), AuditEvent.objects.count()) == (before, groups, audited)


def audit_rows() -> list[tuple[str, str, str, dict[str, object]]]:
    return list(AuditEvent.objects.order_by("seq").values_list("actor_kind", "actor_id", "action", "details"))


@pytest.mark.parametrize("role", [OPERATOR, ADMIN, AUDITOR])
def test_an_admin_grants_and_revokes_a_role_with_one_audit_row_each(clock, root, role) -> None:
    bob = User.objects.create_user("bob")
    role_grant(actor=root, user=bob, role=role)
    assert has_role(Principal.of_user(bob), role)  # the cache of this object was refreshed
    assert audit_rows() == [("user", "root", "role_granted", {"user": "bob", "role": role})]
    role_revoke(actor=root, user=bob, role=role)
    assert not has_role(Principal.of_user(bob), role)
    assert not has_role(Principal.of_user(User.objects.get(pk=bob.pk)), role)
    assert audit_rows()[1:] == [("user", "root", "role_revoked", {"user": "bob", "role": role})]


def test_role_changes_refused_write_nothing(clock, root, ann) -> None:
    carol = person("carol", "auditor")
    gone = person("gus")
    deactivate(gone)
    role_refused(lambda: role_grant(actor=root, user=ann.user, role=OPERATOR))  # already
    role_refused(lambda: role_revoke(actor=root, user=ann.user, role=AUDITOR))  # not held
    role_refused(lambda: role_grant(actor=root, user=ann.user, role="superuser"))
    role_refused(lambda: role_grant(actor=root, user=gone.user, role=OPERATOR))
    for actor in (ann, carol, Principal.agent("agent-1"), Principal.system("scheduler")):
        role_refused(partial(role_grant, actor=actor, user=actor.user or ann.user, role=ADMIN), PermissionDenied)
        role_refused(partial(role_revoke, actor=actor, user=root.user, role=ADMIN), PermissionDenied)


def test_the_last_admin_cannot_revoke_their_own_admin_role(clock, root) -> None:
    role_refused(lambda: role_revoke(actor=root, user=root.user, role=ADMIN))
    max_ = person("max", "admin")
    deactivate(max_)  # a deactivated admin is no admin: root is still the last one
    role_refused(lambda: role_revoke(actor=root, user=root.user, role=ADMIN))
    ada = person("ada", "admin")
    role_revoke(actor=root, user=root.user, role=ADMIN)
    assert not has_role(root, ADMIN)
    role_refused(lambda: role_revoke(actor=ada, user=ada.user, role=ADMIN))


def test_create_admin_bootstraps_the_first_admin_audited_as_the_system(clock) -> None:
    user, password = admin_bootstrap(username="first")
    assert password and user.check_password(password)
    assert has_role(Principal.of_user(User.objects.get(username="first")), ADMIN)
    assert audit_rows() == [
        (
            "system",
            "create_admin",
            "role_granted",
            {"user": "first", "role": ADMIN, "bootstrap": True, "account_created": True},
        ),
    ]
    role_refused(lambda: admin_bootstrap(username="first"))  # exists
    role_refused(lambda: admin_bootstrap(username="first", existing=True))  # already admin
    role_refused(lambda: admin_bootstrap(username="nobody", existing=True))
    User.objects.create_user("old", password="kept-password")
    user, password = admin_bootstrap(username="old", existing=True)
    assert password is None and user.check_password("kept-password")


def test_the_create_admin_command_prints_a_password_and_refuses_an_existing_user(clock) -> None:
    out = io.StringIO()
    call_command("create_admin", "first", stdout=out)
    password = re.search(r"password: (\S+)", out.getvalue())
    assert password is not None
    assert User.objects.get(username="first").check_password(password.group(1))
    with pytest.raises(CommandError, match="--existing"):
        call_command("create_admin", "first", stdout=io.StringIO())
    assert AuditEvent.objects.count() == 1


def test_only_an_admin_opens_accounts_and_resets_passwords(clock, root, ann) -> None:
    carol = person("carol", "auditor")
    for actor in (ann, carol, person("sue", superuser=True), Principal.system("scheduler")):
        role_refused(partial(account_create, actor=actor, username="newbie", role=OPERATOR), PermissionDenied)
        role_refused(partial(account_password_reset, actor=actor, user=carol.user), PermissionDenied)
    role_refused(lambda: account_create(actor=root, username="newbie", role="root"))
    role_refused(lambda: account_create(actor=root, username="x" * 151, role=OPERATOR))
    role_refused(lambda: account_password_reset(actor=root, user=root.user))
    max_ = person("max", "admin")
    role_refused(lambda: account_password_reset(actor=root, user=max_.user))
    user, password = account_create(actor=root, username="newbie", role=AUDITOR)
    assert user.check_password(password)
    assert account_password_reset(actor=root, user=user) != password
    assert [row[2] for row in audit_rows()] == ["account_created", "role_granted", "password_reset"]


def test_a_grant_given_twice_or_revoked_when_absent_is_refused(make_task, clock, root, ann) -> None:
    permission_grant(actor=root, user=ann.user, project="billing")
    role_refused(lambda: permission_grant(actor=root, user=ann.user, project="billing"), GrantRefused)
    role_refused(lambda: permission_revoke(actor=root, user=ann.user, kind="export"), GrantRefused)
    task = make_task()
    permission_grant(actor=root, user=ann.user, task=task)
    role_refused(lambda: permission_grant(actor=root, user=ann.user, task=task), GrantRefused)
    permission_revoke(actor=root, user=ann.user, task=task)
    role_refused(lambda: permission_revoke(actor=root, user=ann.user, task=task), GrantRefused)


def test_roles_are_read_once_per_user_object(django_assert_num_queries, make_task, clock, root) -> None:
    task = make_task()
    admin = Principal.of_user(User.objects.get(pk=root.user.pk))
    with django_assert_num_queries(1):
        for role in (ADMIN, OPERATOR, AUDITOR, ADMIN):
            has_role(admin, role)
        assert can_view(admin, task)
        assert can_operate_task(admin, task)


# --- forced release ---------------------------------------------------------------------------------------------


def test_a_non_admin_cannot_force_release_a_lease(make_task, agent_lease, clock, root, ann) -> None:
    task = make_task(project="billing", kind="migrate")
    permission_grant(actor=root, user=ann.user, task=task)
    agent_lease(task)
    staff = person("sam", "operator", "auditor", staff=True)
    for who in (ann, staff, Principal.agent("agent-2"), Principal.system("reaper")):
        refused(partial(lease_force_release, actor=who, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT))
    lease = lease_open(task.pk)
    assert lease is not None and lease.holder_id == "agent-1"


def test_the_admin_who_forced_a_release_cannot_review_it(make_task, agent_lease, clock, root) -> None:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    forced = lease_force_release(actor=root, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT)
    row = ForcedRelease.objects.filter(pk=forced.pk).values().get()
    for verdict in ("accepted", "disputed"):
        refused(
            partial(forced_release_review, actor=root, forced_release_id=forced.pk, verdict=verdict, note=REVIEW_NOTE)
        )
    same_admin_again = Principal.of_user(User.objects.get(username="root"))
    refused(
        lambda: forced_release_review(
            actor=same_admin_again, forced_release_id=forced.pk, verdict="accepted", note=REVIEW_NOTE
        )
    )
    assert ForcedRelease.objects.filter(pk=forced.pk).values().get() == row
    assert row["status"] == "pending"


def test_a_renamed_admin_still_cannot_review_their_own_forced_release(make_task, agent_lease, clock, root) -> None:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    forced = lease_force_release(actor=root, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT)
    row = ForcedRelease.objects.filter(pk=forced.pk).values().get()
    root.user.username = "root-renamed"
    root.user.save(update_fields=["username"])
    renamed = Principal.of_user(root.user)
    refused(
        lambda: forced_release_review(actor=renamed, forced_release_id=forced.pk, verdict="accepted", note=REVIEW_NOTE)
    )
    assert ForcedRelease.objects.filter(pk=forced.pk).values().get() == row


def test_a_non_admin_cannot_review_a_forced_release(make_task, agent_lease, clock, root, ann) -> None:
    task = make_task(chain_plan("a"))
    permission_grant(actor=root, user=ann.user, task=task)
    agent_lease(task)
    forced = lease_force_release(actor=root, task_id=task.pk, justification=JUSTIFICATION, impact=IMPACT)
    for who in (ann, person("carol", "auditor"), Principal.agent("agent-1")):
        refused(
            partial(forced_release_review, actor=who, forced_release_id=forced.pk, verdict="accepted", note=REVIEW_NOTE)
        )


# --- agents -----------------------------------------------------------------------------------------------------


def test_an_agent_may_cancel(make_task, agent_lease, clock) -> None:
    task = make_task(project="billing", kind="migrate")
    lease = agent_lease(task)
    cancelled = task_request_cancel(
        actor=Principal.agent("agent-1"), task_id=task.pk, reason="the source is gone", lease=lease
    )
    assert cancelled.cancel_requested_at is not None
    assert cancelled.cancel_requested_by == "agent:agent-1"
    event = AuditEvent.objects.get(action="cancel_requested")
    assert (event.actor_kind, event.actor_id, event.task_id) == ("agent", "agent-1", task.pk)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL for real concurrent revocations")
def test_two_admins_revoking_each_other_at_once_leave_one_admin() -> None:
    from tests.test_races_postgres import run_threads

    for round_ in range(6):
        pair = [person(f"a{round_}", "admin").user, person(f"b{round_}", "admin").user]
        outcomes: list[str] = []

        def revoke_the_other(
            index: int, barrier: threading.Barrier, pair: list[User] = pair, outcomes: list[str] = outcomes
        ) -> None:
            me, other = pair[index], pair[1 - index]
            actor = Principal.of_user(User.objects.get(pk=me.pk))
            barrier.wait()
            try:
                role_revoke(actor=actor, user=User.objects.get(pk=other.pk), role=ADMIN)
                outcomes.append("revoked")
            except (RoleRefused, PermissionDenied) as error:
                outcomes.append(type(error).__name__)

        run_threads(2, revoke_the_other)
        assert outcomes.count("revoked") == 1, outcomes
        assert User.objects.filter(groups__name=ADMIN, username__in=[u.username for u in pair]).count() == 1
        for user in pair:  # the survivor is the only admin again for the next round's pair to start clean
            user.groups.clear()
    assert AuditEvent.objects.filter(action="role_revoked").count() == 6
