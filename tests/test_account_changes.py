"""Every change of access is on the audit chain, whatever path made it ("role and permission changes …
are audited"). The services audit their own changes; these tests go around them — the ORM, a bulk ``update()``, raw
SQL, django-guardian's shortcuts, a group renamed — and check that the database captured each change in its own
transaction and that the fold puts it on the chain once; that the capture table cannot be emptied, altered or
marked recorded without the audit event; and that a missing capture trigger is reported."""

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.db import connection, transaction
from django.db.utils import DatabaseError
from guardian.shortcuts import assign_perm, remove_perm

from audit.account_changes import ACTION, account_changes_fold, account_changes_fold_all
from audit.append_only import AUDIT_TRIGGERS, missing_triggers
from audit.jobs import fold_account_changes_job
from audit.models import AccountChange, AuditEvent
from audit.services import verify_audit
from tasks.access.permissions import ADMIN, OPERATOR
from tests.conftest import as_a_tamperer, person


def raw(sql: str, params: Sequence[Any] = ()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))


def captured_on_chain() -> list[dict[str, object]]:
    """The details of every captured change on the audit chain, in chain order, less the bookkeeping keys."""
    keep = ("capture", "captured_at")
    return [
        {k: v for k, v in event.details.items() if k not in keep}
        for event in AuditEvent.objects.filter(action=ACTION).order_by("seq")
    ]


@pytest.fixture
def clean_slate(db: None) -> None:
    """What the set-up's migrations captured is folded first: each test sees only its own changes."""
    account_changes_fold_all()
    AuditEvent.objects.filter(action=ACTION).count()


def only_new(before: int) -> list[dict[str, object]]:
    return captured_on_chain()[before:]


def test_each_path_around_the_services_is_captured_and_put_on_the_chain_once(clean_slate: None) -> None:
    bob = User.objects.create_user("bob")
    admin_group = Group.objects.get_or_create(name=ADMIN)[0]
    before = len(captured_on_chain())

    bob.groups.add(admin_group)  # the ORM, as the Django admin's form does
    User.objects.filter(pk=bob.pk).update(is_superuser=True)  # a bulk update: no signal fires
    raw("UPDATE auth_user SET is_staff = %s WHERE id = %s", [True, bob.pk])  # raw SQL
    assign_perm("tasks.operate_task", bob)  # django-guardian: a model permission for the user
    bob.user_permissions.remove(Permission.objects.get(codename="operate_task"))
    Group.objects.filter(name=ADMIN).update(name="admins")  # renaming a role's group takes the role from its members
    raw("DELETE FROM auth_user_groups WHERE user_id = %s", [bob.pk])

    assert AccountChange.objects.filter(audit_seq__isnull=True).count() == 7
    assert account_changes_fold() == 7
    assert account_changes_fold() == 0, "a change is folded once"
    assert only_new(before) == [
        {"table": "auth_user_groups", "operation": "insert", "user": "bob", "user_id": bob.pk, "group": ADMIN},
        {"table": "auth_user", "operation": "update", "user": "bob", "created": False, "is_superuser": [False, True]},
        {"table": "auth_user", "operation": "update", "user": "bob", "created": False, "is_staff": [False, True]},
        {
            "table": "auth_user_user_permissions",
            "operation": "insert",
            "user": "bob",
            "user_id": bob.pk,
            "permission": "tasks.operate_task",
        },
        {
            "table": "auth_user_user_permissions",
            "operation": "delete",
            "user": "bob",
            "user_id": bob.pk,
            "permission": "tasks.operate_task",
        },
        {
            "table": "auth_group",
            "operation": "update",
            "before": {"group": ADMIN, "group_id": admin_group.pk},
            "after": {"group": "admins", "group_id": admin_group.pk},
        },
        {"table": "auth_user_groups", "operation": "delete", "user": "bob", "user_id": bob.pk, "group": "admins"},
    ]
    events = AuditEvent.objects.filter(action=ACTION).order_by("-seq")[:7]
    assert {(e.actor_kind, e.actor_id) for e in events} == {("system", "database")}
    assert all(AccountChange.objects.get(pk=e.details["capture"]).audit_seq == e.seq for e in events)
    assert verify_audit().problem is None


def test_object_permissions_of_users_and_groups_are_captured(clean_slate: None, make_task) -> None:
    task = make_task()
    ops = Group.objects.get_or_create(name=OPERATOR)[0]
    carol = User.objects.create_user("carol")
    before = len(captured_on_chain())
    assign_perm("tasks.operate_task", carol, task)
    assign_perm("tasks.operate_task", ops, task)
    remove_perm("tasks.operate_task", carol, task)
    account_changes_fold_all()
    common = {"permission": "tasks.operate_task", "content_type": "tasks.task", "object_pk": str(task.pk)}
    assert only_new(before) == [
        {"table": "guardian_userobjectpermission", "operation": "insert", "user": "carol", "user_id": carol.pk}
        | common,
        {"table": "guardian_groupobjectpermission", "operation": "insert", "group": OPERATOR} | common,
        {"table": "guardian_userobjectpermission", "operation": "delete", "user": "carol", "user_id": carol.pk}
        | common,
    ]


def test_what_is_not_a_change_of_access_is_not_captured(clean_slate: None) -> None:
    dave = User.objects.create_user("dave", password="an old password")  # an ordinary account: no flag, no role
    Group.objects.create(name="book-club")  # a group with no member and no permission grants nothing
    dave.set_password("a new password")
    dave.last_name = "Doe"
    dave.save()
    User.objects.filter(pk=dave.pk).update(last_login=dave.date_joined)
    assert not AccountChange.objects.filter(audit_seq__isnull=True).exists()


def test_a_change_rolled_back_leaves_no_capture_and_a_capture_shares_its_change_s_fate(clean_slate: None) -> None:
    erin = User.objects.create_user("erin")
    with pytest.raises(RuntimeError), transaction.atomic():
        User.objects.filter(pk=erin.pk).update(is_superuser=True)
        assert AccountChange.objects.filter(audit_seq__isnull=True).count() == 1  # written with the change
        raise RuntimeError("the change fails")
    assert not AccountChange.objects.filter(audit_seq__isnull=True).exists()


def test_the_capture_table_cannot_be_emptied_altered_or_marked_recorded_without_its_audit_event(
    clean_slate: None,
) -> None:
    frank = person("frank")
    User.objects.filter(pk=User.objects.get(username="frank").pk).update(is_staff=True)
    row = AccountChange.objects.get(audit_seq__isnull=True)
    statements: list[tuple[str, Sequence[Any]]] = [
        ("DELETE FROM audit_accountchange WHERE id = %s", [row.pk]),
        ("UPDATE audit_accountchange SET change = %s WHERE id = %s", ['{"user": "someone else"}', row.pk]),
        # marked recorded by an audit event that is not its own (the last one on the chain, whatever it is)
        ("UPDATE audit_accountchange SET audit_seq = (SELECT MAX(seq) FROM audit_auditevent) WHERE id = %s", [row.pk]),
    ]
    if connection.vendor == "postgresql":
        statements.append(("TRUNCATE audit_accountchange", []))
    for sql, params in statements:
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            raw(sql, params)
    assert AccountChange.objects.get(pk=row.pk).change == row.change
    assert account_changes_fold() == 1
    folded = AccountChange.objects.get(pk=row.pk)
    assert folded.audit_seq is not None
    for sql, params in [
        ("UPDATE audit_accountchange SET audit_seq = NULL WHERE id = %s", [row.pk]),  # to be folded again, or hidden
        ("DELETE FROM audit_accountchange WHERE id = %s", [row.pk]),
    ]:
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            raw(sql, params)
    assert frank.id == "frank"


def test_a_missing_capture_trigger_is_reported_by_verify(clean_slate: None) -> None:
    assert missing_triggers(AUDIT_TRIGGERS) == []
    as_a_tamperer()  # SQLite: drops the triggers (the test's transaction brings them back); PostgreSQL: see below
    if connection.vendor == "postgresql":
        raw("DROP TRIGGER audit_capture_auth_user_groups_row ON auth_user_groups")
        assert missing_triggers(AUDIT_TRIGGERS) == ["auth_user_groups.audit_capture_auth_user_groups_row"]
    else:
        assert "auth_user_groups.audit_capture_auth_user_groups_insert" in missing_triggers(AUDIT_TRIGGERS)
    verdict = verify_audit()
    assert verdict.problem is not None and "audit_capture_auth_user_groups" in verdict.problem


def test_the_beat_job_and_verify_audit_fold_and_the_verdict_counts_what_is_pending(clean_slate: None) -> None:
    from django.conf import settings

    assert settings.CELERY_BEAT_SCHEDULE["account-changes-fold"]["task"] == "audit.fold_account_changes"
    gina = User.objects.create_user("gina")
    User.objects.filter(pk=gina.pk).update(is_superuser=True)
    assert verify_audit().account_changes_pending == 1
    assert fold_account_changes_job() == 1
    assert verify_audit().account_changes_pending == 0
    User.objects.filter(pk=gina.pk).update(is_superuser=False)
    from io import StringIO

    out = StringIO()
    call_command("verify_audit", stdout=out)
    assert "account changes: 1 captured by the database, now on the audit chain" in out.getvalue()
    assert captured_on_chain()[-1]["is_superuser"] == [True, False]


@pytest.mark.django_db(transaction=True)
def test_folds_racing_each_other_put_each_change_on_the_chain_once() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writer at a time: no race to have")
    users = [User.objects.create_user(f"racer{n}") for n in range(40)]
    for user in users:
        User.objects.filter(pk=user.pk).update(is_staff=True)
    pending = AccountChange.objects.filter(audit_seq__isnull=True).count()
    assert pending >= 40
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def fold() -> None:
        try:
            barrier.wait()
            while account_changes_fold(limit=7):
                pass
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=fold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    captures = [e.details["capture"] for e in AuditEvent.objects.filter(action=ACTION)]
    assert len(captures) == len(set(captures)) == pending
    assert not AccountChange.objects.filter(audit_seq__isnull=True).exists()
    assert verify_audit().problem is None


def test_reckon_s_own_grants_are_captured_whatever_path_scope_grants_and_agent_tokens(clean_slate: None) -> None:
    from api.models import ApiToken
    from api.tokens import api_token_issue, api_token_revoke
    from tasks.access.permissions import permission_grant
    from tasks.models import ScopeGrant

    admin = person("ann", ADMIN)
    hal = User.objects.create_user("hal")
    account_changes_fold_all()
    before = len(captured_on_chain())
    permission_grant(actor=admin, user=hal, project="acme")  # through the service (audited by it too)
    ScopeGrant.objects.filter(user=hal).update(project="*", kind="migrate")  # past it: widened by hand
    token, _ = api_token_issue(actor=admin, agent_id="agent-7", kinds=["migrate"], projects=[])
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=token.created_at)  # a use: not a change of access
    ApiToken.objects.filter(pk=token.pk).update(kinds=["migrate", "sync"])  # scope widened past the service
    api_token_revoke(actor=admin, token_id=token.pk, reason="rotated after the incident review")
    account_changes_fold_all()
    found = only_new(before)
    hal_grant = {"user": "hal", "user_id": hal.pk, "granted_by": str(admin)}
    token_row = {"token_id": token.pk, "agent": "agent-7", "created_by": str(admin)}
    assert found == [
        {"table": "tasks_scopegrant", "operation": "insert", "project": "acme", "kind": "*"} | hal_grant,
        {
            "table": "tasks_scopegrant",
            "operation": "update",
            "before": {"project": "acme", "kind": "*"} | hal_grant,
            "after": {"project": "*", "kind": "migrate"} | hal_grant,
        },
        {"table": "api_apitoken", "operation": "insert", "name": "", "kinds": ["migrate"], "projects": []} | token_row,
        {
            "table": "api_apitoken",
            "operation": "update",
            "before": {"name": "", "kinds": ["migrate"], "projects": []} | token_row,
            "after": {"name": "", "kinds": ["migrate", "sync"], "projects": []} | token_row,
        },
        {
            "table": "api_apitoken",
            "operation": "update",
            "before": {"name": "", "kinds": ["migrate", "sync"], "projects": []} | token_row,
            "after": {"name": "", "kinds": ["migrate", "sync"], "projects": [], "revoked_by": str(admin)} | token_row,
        },
    ]
    assert "token_hash" not in str(found) and token.token_hash not in str(found)


def test_the_django_admin_shows_access_but_does_not_change_it(clean_slate: None, client: Any) -> None:
    """The Django admin's account forms would change roles past tasks.access.permissions (its last-admin rule, its audit
    of who and why): the access fields are read-only there, groups cannot be edited, accounts not added."""
    root = User.objects.create_superuser("root", password="a long enough password 1")
    ivy = User.objects.create_user("ivy", email="ivy@example.com")
    admin_group = Group.objects.get_or_create(name=ADMIN)[0]
    client.force_login(root)
    page = client.get(f"/admin/auth/user/{ivy.pk}/change/")
    assert page.status_code == 200
    assert 'name="groups"' not in page.content.decode() and 'name="is_superuser"' not in page.content.decode()
    form = {
        "username": "ivy",
        "email": "ivy2@example.com",
        "groups": [admin_group.pk],
        "is_superuser": "on",
        "is_staff": "on",
        "is_active": "on",
    }
    saved = client.post(f"/admin/auth/user/{ivy.pk}/change/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    ivy.refresh_from_db()
    assert ivy.email == "ivy2@example.com"  # what the admin may still change
    assert (ivy.is_superuser, ivy.is_staff, list(ivy.groups.all())) == (False, False, [])
    assert client.get("/admin/auth/user/add/").status_code == 403
    assert client.post(f"/admin/auth/user/{ivy.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"/admin/auth/group/{admin_group.pk}/change/", {"name": "x"}).status_code == 403
    assert Group.objects.filter(name=ADMIN).exists()
