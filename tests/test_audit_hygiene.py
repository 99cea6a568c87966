"""Checkpoint hygiene (invariant 8) on the audit chain (invariant 9): ``audit_append`` judges every field it stores —
reason, impact, details — so no service can forget it; a refusal comes before anything is written and leaves the
database as it was, whichever service it is."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import transaction

from api.tokens import api_token_issue, api_token_revoke
from audit.account_changes import account_changes_fold_all
from audit.hygiene import PAYLOAD_CAP_BYTES, PayloadTooLarge, SecretInPayload
from audit.models import AuditEvent
from audit.principals import Principal
from audit.services import audit_append
from leases.clock import ControllableClock
from leases.services import lease_release
from tasks.core.outcomes import Committed
from tasks.models import Task
from tasks.people.bulk import Seen, bulk_run_create
from tasks.people.cancel import task_request_cancel
from tasks.people.forced_release import forced_release_review, lease_force_release
from tasks.people.notes import task_note_add
from tasks.people.replan import plan_propose_by_person
from tasks.people.settlement import operation_settle_by_hand
from tasks.people.takeover import NodeResult, takeover_claim, takeover_release, takeover_submit
from tests.conftest import chain_plan, person, snapshot
from tests.steps import send, version

pytestmark = pytest.mark.django_db

PASSWORD = "hunter2" + "xyz"
SECRET = "checked it by hand; the store's password=" + PASSWORD
LARGE = "nothing more to say about it. " * 600  # prose, over the cap
CLEAN = "checked it by hand against the store's listing"
CREATOR = Principal.agent("tester")  # make_task's tasks are created by agent:tester: it may cancel them
IMPACT = "its in-flight copy is reconciled by op key afterwards"

assert len(LARGE.encode()) > PAYLOAD_CAP_BYTES


def appended(clock: ControllableClock, **fields: Any) -> AuditEvent:
    with transaction.atomic():
        return audit_append(actor=Principal.system("test"), action="checked", at=clock.now(), **fields)


# --- audit_append itself -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"reason": SECRET}, "$.reason"),
        ({"impact": "log in with api_key=AbCd1234 to see it"}, "$.impact"),
        ({"details": {"evidence": [{"kind": "console", "value": SECRET}]}}, "$.details.evidence[0].value"),
        ({"details": {"headers": {"Authorization": "x"}}}, "$.details.headers.Authorization"),
        ({"details": {"token": "t-1"}}, "$.details.token"),
    ],
    ids=["reason", "impact", "details text", "details key", "a credential key holding text"],
)
def test_audit_append_refuses_credential_like_data_in_any_field_it_stores(clock, fields, path) -> None:
    appended(clock, reason="a first row, so the chain's head exists")
    before = snapshot()
    with pytest.raises(SecretInPayload, match=r"the checked audit row carries credential-like data at") as caught:
        appended(clock, **fields)
    assert caught.value.details["paths"] == [path]
    assert PASSWORD not in str(caught.value) and "AbCd1234" not in str(caught.value)
    assert snapshot() == before


@pytest.mark.parametrize(
    "fields",
    [
        {"impact": LARGE},
        {"reason": LARGE},
        {"details": {"lines": [LARGE]}},
        {"reason": LARGE[:9000], "impact": LARGE[:9000]},
    ],
    ids=["impact", "reason", "details", "reason and impact together"],
)
def test_audit_append_refuses_fields_over_the_cap(clock, fields) -> None:
    before = snapshot()
    with pytest.raises(PayloadTooLarge, match="the checked audit row is"):
        appended(clock, **fields)
    assert snapshot() == before


def test_the_id_of_a_row_under_a_credential_word_is_a_reference_not_a_credential(clock) -> None:
    """An audit row names the API token it issued by its id ("token": 12); text or a flag there is refused still."""
    assert appended(clock, details={"token": 12, "token_id": 12}).details == {"token": 12, "token_id": 12}
    for value in ("12", True, None, [12]):
        with pytest.raises(SecretInPayload):
            appended(clock, details={"token": value})


# --- every service that writes an audit row ------------------------------------------------------------------------

type Service = Callable[[str], object]


def _force_release_impact(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    root = person("root", "admin")
    return lambda text: lease_force_release(
        actor=root, task_id=task.pk, justification="agent worker-7 has been wedged for an hour", impact=text
    )


def _force_release_justification(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    root = person("root", "admin")
    return lambda text: lease_force_release(actor=root, task_id=task.pk, justification=text, impact=IMPACT)


def _review_forced_release(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    agent_lease(task)
    root, other = person("root", "admin"), person("other", "admin")
    forced = lease_force_release(
        actor=root, task_id=task.pk, justification="agent worker-7 has been wedged for an hour", impact=IMPACT
    )
    return lambda text: forced_release_review(actor=other, forced_release_id=forced.pk, verdict="accepted", note=text)


def _submit_takeover(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    admin = person("ann", "admin")
    lease = takeover_claim(actor=admin, task_id=task.pk).lease
    assert lease is not None
    return lambda text: takeover_submit(
        actor=admin,
        lease=lease,
        based_on_version=version(task),
        decision="end_task",
        end_status="completed",
        results=[NodeResult(node_key="a", remote_id="r-a")],
        note=text,
    )


def _release_takeover(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    admin = person("ann", "admin")
    lease = takeover_claim(actor=admin, task_id=task.pk).lease
    assert lease is not None
    return lambda text: takeover_release(actor=admin, lease=lease, reason=text)


def _settle_by_hand(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    lease = agent_lease(task)
    op = send(task, lease, "a")
    lease_release(lease=lease)
    admin = person("ann", "admin")
    assert takeover_claim(actor=admin, task_id=task.pk).granted
    return lambda text: operation_settle_by_hand(
        actor=admin,
        task_id=task.pk,
        op_key=op.op_key,
        expected_version=version(task),
        resolution="done",
        receipt=Committed(remote_id="r-a"),
        note=text,
    )


def _cancel(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    return lambda text: task_request_cancel(actor=CREATOR, task_id=task.pk, reason=text)


def _bulk_run(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    admin = person("root", "admin")
    return lambda text: bulk_run_create(
        actor=admin, operation="cancel", reason=text, seen=[Seen(task.pk, version(task), None)]
    )


def _note(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    admin = person("ann", "admin")
    return lambda text: task_note_add(actor=admin, task_id=task.pk, text=text)


def _replan(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    task = make_task(chain_plan("a"))
    admin = person("ann", "admin")
    assert takeover_claim(actor=admin, task_id=task.pk).granted
    return lambda text: plan_propose_by_person(
        actor=admin, task_id=task.pk, plan=chain_plan("a", "b"), expected_version=version(task), reason=text
    )


def _revoke_token(make_task: Callable[..., Task], agent_lease: Any) -> Service:
    admin = person("root", "admin")
    token, _plaintext = api_token_issue(actor=admin, agent_id="agent-7", kinds=["test"], projects=[])
    return lambda text: api_token_revoke(actor=admin, token_id=token.pk, reason=text)


AUDITED_SERVICES = {
    "forced release (impact)": _force_release_impact,
    "forced release (justification)": _force_release_justification,
    "forced release reviewed": _review_forced_release,
    "takeover submitted": _submit_takeover,
    "takeover released": _release_takeover,
    "settled by hand": _settle_by_hand,
    "cancel": _cancel,
    "bulk run": _bulk_run,
    "note": _note,
    "re-plan proposed": _replan,
    "API token revoked": _revoke_token,
}
# A note holds at most NOTE_MAX_CHARS characters and a revocation's reason is cut to 500: neither can reach the cap.
WITHIN_THE_CAP = {"note", "API token revoked"}
CASES = [(name, SECRET, SecretInPayload) for name in AUDITED_SERVICES] + [
    (name, LARGE, PayloadTooLarge) for name in AUDITED_SERVICES if name not in WITHIN_THE_CAP
]


@pytest.mark.parametrize(
    ("service", "text", "refusal"),
    CASES,
    ids=[f"{name}: {'a credential' if refusal is SecretInPayload else 'over the cap'}" for name, _t, refusal in CASES],
)
def test_an_audited_service_refuses_a_credential_or_text_over_the_cap_and_writes_nothing(
    make_task, agent_lease, clock, monkeypatch, service, text, refusal
) -> None:
    call = AUDITED_SERVICES[service](make_task, agent_lease)
    told: list[str] = []
    monkeypatch.setattr("tasks.engine.cas.event_written", lambda _task, event: told.append(event.type))
    before = snapshot()
    with pytest.raises(refusal) as caught:
        call(text)
    assert snapshot() == before
    assert told == [], "no observer hears of a change that was refused"
    assert PASSWORD not in str(caught.value)
    monkeypatch.undo()
    rows = AuditEvent.objects.count()
    call(CLEAN)  # the same call with plain text is written, with its audit row
    assert AuditEvent.objects.count() > rows


# --- the database's own record of account changes -----------------------------------------------------------------


def test_a_captured_account_change_the_hygiene_refuses_reaches_the_chain_without_its_content(clock) -> None:
    """The fold must not stop at a change it cannot copy (every later change would wait behind it): it is put on the
    chain without what it carried, saying why; a token's id under "token_id" is copied as it is."""
    admin = person("root", "admin")
    group = Group.objects.create(name="night shift")
    account_changes_fold_all()
    Group.objects.filter(pk=group.pk).update(name="night shift password=" + PASSWORD)
    token, _plaintext = api_token_issue(actor=admin, agent_id="agent-7", kinds=["test"], projects=[])
    account_changes_fold_all()
    captured = list(AuditEvent.objects.filter(action="account_change_captured").order_by("seq"))
    renamed = next(e.details for e in captured if e.details["table"] == "auth_group")
    assert renamed["withheld"] == "secret_in_payload" and PASSWORD not in str(renamed)
    assert {"capture", "operation", "captured_at"} <= renamed.keys()
    issued = next(e.details for e in captured if e.details["table"] == "api_apitoken")
    assert issued["token_id"] == token.pk and "withheld" not in issued
