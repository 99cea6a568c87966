"""The queues as the rules see them: who may open them, that every filter narrows (each test would fail were the
filter ignored), the needs-attention queue's order and reasons, the HTMX refresh, and saved views nobody else
sees."""

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from guardian.shortcuts import assign_perm

from audit.principals import Principal
from console.models import SavedView
from leases.services import lease_acquire, lease_reserve
from tasks.access.permissions import OPERATE, permission_grant
from tasks.models import Task
from tasks.people.notes import task_note_add
from tests.conftest import person

pytestmark = pytest.mark.django_db

QUEUES = ["task-list", "attention"]


def task_ids(html: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'<tr data-task="(\d+)">', html)}


def shown(client: Client, url_name: str = "task-list", **params: Any) -> set[int]:
    response = client.get(reverse(url_name), params)
    assert response.status_code == 200, response.content[:500]
    return task_ids(response.content.decode())


def set_status(task: Task, status: str, **fields: Any) -> None:
    Task.objects.filter(pk=task.pk).update(status=status, **fields)


@pytest.fixture
def admin(client: Client) -> Client:
    client.force_login(person("ada", "admin").user)
    return client


# --- who may open the queues ----------------------------------------------------------------------------------


@pytest.mark.parametrize("url_name", [*QUEUES, "saved-view-create"])
def test_a_logged_out_visitor_is_sent_to_the_login_page(client, db, url_name) -> None:
    response = client.get(reverse(url_name))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_a_logged_out_visitor_cannot_open_or_delete_a_saved_view(client, db) -> None:
    view = _saved(person("ada", "admin").user, "mine")
    for response in (
        client.get(reverse("saved-view-open", args=[view.pk])),
        client.post(reverse("saved-view-delete", args=[view.pk])),
    ):
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert SavedView.objects.filter(pk=view.pk).exists()


@pytest.mark.parametrize("url_name", QUEUES)
def test_an_outsider_without_a_role_is_refused(client, make_task, url_name) -> None:
    make_task()
    client.force_login(person("otto").user)
    assert client.get(reverse(url_name)).status_code == 403
    assert client.get(reverse(url_name), headers={"HX-Request": "true"}).status_code == 403


def test_an_outsider_cannot_save_a_view(client, db) -> None:
    client.force_login(person("otto").user)
    response = client.post(reverse("saved-view-create"), {"name": "x", "screen": "task-list", "query": ""})
    assert response.status_code == 403
    assert not SavedView.objects.exists()


@pytest.mark.parametrize("url_name", QUEUES)
def test_an_operator_sees_only_the_tasks_they_may_operate(client, make_task, url_name) -> None:
    root = Principal.of_user(person("root", "admin").user)
    by_project = make_task(project="acme")
    by_object = make_task(project="globex")
    hidden = make_task(project="globex")
    for task in (by_project, by_object, hidden):
        set_status(task, "human")
    ann = person("ann", "operator").user
    permission_grant(actor=root, user=ann, project="acme")
    assign_perm(OPERATE, ann, by_object)
    client.force_login(User.objects.get(pk=ann.pk))
    assert shown(client, url_name) == {by_project.pk, by_object.pk}
    assert shown(client, url_name, q=hidden.title) == {by_project.pk, by_object.pk}  # text cannot reach it
    assert task_ids(client.get(reverse(url_name), headers={"HX-Request": "true"}).content.decode()) == {
        by_project.pk,
        by_object.pk,
    }


def test_an_operator_without_a_grant_sees_no_task(client, make_task) -> None:
    make_task()
    client.force_login(person("nora", "operator").user)
    assert shown(client) == set()


@pytest.mark.parametrize("role", ["auditor", "admin"])
def test_auditors_and_admins_see_every_task(client, make_task, role) -> None:
    tasks = {make_task(project=p).pk for p in ("acme", "globex", "")}
    client.force_login(person("viv", role).user)
    assert shown(client) == tasks


# --- every filter narrows --------------------------------------------------------------------------------------


@pytest.fixture
def mixed(make_task, clock) -> dict[str, Task]:
    """One task per distinguishing trait; each filter test picks its task out of all of them."""
    tasks = {
        "running acme copy": make_task(project="acme", kind="copy", title="copy the acme bucket"),
        "paused replan": make_task(project="globex", kind="switch", title="switch globex"),
        "paused input": make_task(project="globex", kind="copy", title="copy globex"),
        "completed": make_task(project="acme", kind="switch", title="switch acme"),
        "stopped": make_task(project="initech", kind="copy", title="initech copy"),
        "human": make_task(project="initech", kind="verify", title="verify initech"),
        "agent held": make_task(project="umbrella", kind="copy", title="umbrella copy"),
        "reserved": make_task(project="umbrella", kind="switch", title="umbrella switch"),
    }
    set_status(tasks["running acme copy"], "running")
    set_status(tasks["paused replan"], "paused", status_reason="needs_replan")
    set_status(tasks["paused input"], "paused", status_reason="input_changed")
    set_status(tasks["completed"], "completed")
    set_status(tasks["stopped"], "stopped", cancel_requested_at=clock.now())
    lease_acquire(task_id=tasks["human"].pk, holder_kind="operator", holder_id="ann")
    set_status(tasks["human"], "human")
    lease_acquire(task_id=tasks["agent held"].pk, holder_kind="agent", holder_id="agent-7")
    lease_reserve(task_id=tasks["reserved"].pk, operator_id="bob")
    return tasks


def ids(tasks: dict[str, Task], *names: str) -> set[int]:
    return {tasks[name].pk for name in names}


def test_no_filter_shows_every_task(admin, mixed) -> None:
    assert shown(admin) == ids(mixed, *mixed)


def test_the_state_filter_selects_any_of_its_states(admin, mixed) -> None:
    assert shown(admin, state="paused") == ids(mixed, "paused replan", "paused input")
    assert shown(admin, state=["completed", "stopped"]) == ids(mixed, "completed", "stopped")


def test_the_pause_reason_filter(admin, mixed) -> None:
    assert shown(admin, reason="input_changed") == ids(mixed, "paused input")


def test_the_exclusions_remove_states(admin, mixed) -> None:
    assert shown(admin, exclude=["completed", "stopped"]) == ids(mixed, *mixed) - ids(mixed, "completed", "stopped")


def test_the_kind_filter(admin, mixed) -> None:
    assert shown(admin, kind="verify") == ids(mixed, "human")


def test_the_project_filter(admin, mixed) -> None:
    assert shown(admin, project="acme") == ids(mixed, "running acme copy", "completed")


@pytest.mark.parametrize(
    ("holder", "expected"),
    [("agent", ["agent held"]), ("person", ["human"]), ("ann", ["human"]), ("agent-7", ["agent held"])],
)
def test_the_holder_filter(admin, mixed, holder, expected) -> None:
    assert shown(admin, holder=holder) == ids(mixed, *expected)


def test_the_holder_filter_none_shows_tasks_nobody_holds(admin, mixed) -> None:
    assert shown(admin, holder="none") == ids(mixed, *mixed) - ids(mixed, "agent held", "human")


def test_the_attention_filter(admin, mixed) -> None:
    needing = ids(mixed, "paused replan", "paused input", "human", "reserved")
    assert shown(admin, attention="any") == needing
    assert shown(admin, attention="none") == ids(mixed, *mixed) - needing
    assert shown(admin, attention="takeover_requested") == ids(mixed, "reserved")


def test_the_text_filter_looks_in_title_kind_and_project(admin, mixed) -> None:
    assert shown(admin, q="BUCKET") == ids(mixed, "running acme copy")  # title, any case
    assert shown(admin, q="verif") == ids(mixed, "human")  # kind
    assert shown(admin, q="umbrella") == ids(mixed, "agent held", "reserved")  # project
    assert shown(admin, q=f"#{mixed['stopped'].pk}") == ids(mixed, "stopped")


def test_filters_combine(admin, mixed) -> None:
    assert shown(admin, kind="copy", project="globex", state="paused") == ids(mixed, "paused input")
    assert shown(admin, kind="copy", exclude="running", holder="none") == ids(mixed, "paused input", "stopped")


def test_the_form_shows_the_filters_it_applied(admin, mixed) -> None:
    html = admin.get(reverse("task-list"), {"state": "paused", "q": "globex"}).content.decode()
    assert re.search(r'<input type="checkbox" name="state" value="paused"[^>]*checked', html)
    assert 'name="q" value="globex"' in html


@pytest.mark.parametrize(
    "params", [{"state": "sleeping"}, {"reason": "bored"}, {"attention": "nonsense"}, {"exclude": "nope"}]
)
def test_an_unknown_filter_value_is_refused_with_what_is_wrong(admin, mixed, params) -> None:
    response = admin.get(reverse("task-list"), params)
    assert response.status_code == 400
    html = response.content.decode()
    assert "is not one of the available choices" in html and task_ids(html) == set()


# --- the needs-attention queue ---------------------------------------------------------------------------------


def test_the_attention_queue_lists_only_tasks_needing_a_person_oldest_waiting_first(admin, make_task, clock) -> None:
    calm = make_task()
    first = make_task()
    set_status(first, "human", updated_at=clock.now() - timedelta(hours=3))
    second = make_task()
    set_status(second, "paused", status_reason="budget_exhausted", updated_at=clock.now() - timedelta(hours=2))
    third = make_task()
    lease_reserve(task_id=third.pk, operator_id="ann")
    html = admin.get(reverse("attention")).content.decode()
    order = [int(pk) for pk in re.findall(r'<tr data-task="(\d+)">', html)]
    assert order == [first.pk, second.pk, third.pk]
    assert calm.pk not in order
    row = html[html.index(f'<tr data-task="{second.pk}">') :].split("</tr>")[0]
    # Each reason spelled out, with what it means, not a bare code.
    assert "attempt budget exhausted" in row and "a person must take over" in row
    assert "paused" in row
    assert "Waiting since" in html


def test_the_attention_queue_filters_too(admin, mixed) -> None:
    assert shown(admin, "attention", project="globex") == ids(mixed, "paused replan", "paused input")
    assert shown(admin, "attention", holder="person") == ids(mixed, "human")
    assert shown(admin, "attention", state="completed") == set()


# --- live refresh ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url_name", QUEUES)
def test_an_htmx_refresh_gets_only_the_rows(admin, mixed, url_name) -> None:
    response = admin.get(reverse(url_name), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.strip().startswith('<tbody id="queue-rows"') and html.strip().endswith("</tbody>")
    assert "<html" not in html and "Saved views" not in html
    assert task_ids(html) == shown(admin, url_name)
    assert "HX-Request" in response["Vary"]
    assert "HX-Request" in admin.get(reverse(url_name))["Vary"]


@pytest.mark.parametrize("header", ["HX-History-Restore-Request", "HX-Boosted"])
def test_a_history_restore_or_a_boosted_link_gets_the_whole_page(admin, mixed, header) -> None:
    response = admin.get(reverse("task-list"), headers={"HX-Request": "true", header: "true"})
    assert "<html" in response.content.decode()


def test_the_page_polls_its_rows_every_10_s_while_visible_and_says_so(admin, mixed) -> None:
    html = admin.get(reverse("task-list"), {"project": "acme"}).content.decode()
    link = re.search(r'<a href="([^"]+)" hx-get="([^"]+)"[^>]*hx-trigger="([^"]+)"', html)
    assert link is not None
    href, hx_get, trigger = link.groups()
    assert href == hx_get == "/?project=acme"  # a plain link does the same without JavaScript
    assert "every 10s [document.visibilityState === 'visible']" in trigger.replace("&#x27;", "'")
    assert "refreshes every 10 s" in html
    assert 'hx-target="#queue-rows"' in html


def test_every_hx_get_has_an_href(admin, mixed) -> None:
    for url_name in QUEUES:
        html = admin.get(reverse(url_name)).content.decode()
        for tag in re.findall(r"<[a-z]+\s[^>]*hx-get=[^>]*>", html):
            assert tag.startswith("<a ") and "href=" in tag, tag


def test_a_filter_showing_only_ended_tasks_does_not_poll(admin, mixed) -> None:
    html = admin.get(reverse("task-list"), {"state": ["completed", "stopped"]}).content.decode()
    assert "hx-trigger" not in html and "no automatic refresh" in html
    rows = admin.get(reverse("task-list"), {"state": "completed"}, headers={"HX-Request": "true"})
    assert rows.status_code == 286  # htmx: stop polling
    assert task_ids(rows.content.decode()) == ids(mixed, "completed")
    excluded = admin.get(
        reverse("task-list"),
        {
            "exclude": [
                "pending",
                "running",
                "observing",
                "backing_off",
                "paused",
                "human",
                "stopping",
                "stopped_pending",
                "quarantined",
            ]
        },
    )
    assert "hx-trigger" not in excluded.content.decode()


def test_a_filter_that_may_show_a_live_task_keeps_polling(admin, mixed) -> None:
    assert "hx-trigger" in admin.get(reverse("task-list"), {"state": ["completed", "paused"]}).content.decode()
    assert admin.get(reverse("task-list"), headers={"HX-Request": "true"}).status_code == 200


# --- saved views -----------------------------------------------------------------------------------------------


def _saved(user: User, name: str, screen: str = "task-list", query: str = "project=acme") -> SavedView:
    from console.saved_views import saved_view_save

    return saved_view_save(owner=user, name=name, screen=screen, query=query)


def test_a_person_saves_the_current_filters_and_opens_them_again(client, mixed) -> None:
    ann = person("ann", "auditor").user
    client.force_login(ann)
    response = client.post(
        reverse("saved-view-create"),
        {"name": "acme paused", "screen": "task-list", "query": "project=acme&state=paused&after=xyz&junk=1"},
    )
    assert response.status_code == 302 and response["Location"] == "/?state=paused&project=acme"
    view = SavedView.objects.get(owner=ann)
    assert (view.name, view.screen, view.query) == ("acme paused", "task-list", "state=paused&project=acme")
    html = client.get(reverse("task-list")).content.decode()
    assert f'href="{reverse("saved-view-open", args=[view.pk])}">acme paused</a>' in html
    opened = client.get(reverse("saved-view-open", args=[view.pk]))
    assert opened.status_code == 302 and opened["Location"] == "/?state=paused&project=acme"


def test_saving_under_the_same_name_replaces_the_view(client, db) -> None:
    ann = person("ann", "operator").user
    client.force_login(ann)
    for query in ("project=acme", "project=globex"):
        client.post(reverse("saved-view-create"), {"name": "mine", "screen": "attention", "query": query})
    assert list(SavedView.objects.values_list("name", "screen", "query")) == [("mine", "attention", "project=globex")]


def test_a_saved_view_needs_a_name_and_a_known_queue(client, db) -> None:
    client.force_login(person("ann", "operator").user)
    for data in ({"name": "", "screen": "task-list"}, {"name": "x", "screen": "admin"}):
        response = client.post(reverse("saved-view-create"), data)
        assert response.status_code == 302
    assert not SavedView.objects.exists()


def test_nobody_sees_opens_or_deletes_another_persons_saved_view(client, db) -> None:
    ann, bob = person("ann", "operator").user, person("bob", "admin").user
    view = _saved(ann, "ann's secret view")
    client.force_login(bob)
    assert "ann&#x27;s secret view" not in client.get(reverse("task-list")).content.decode()
    assert client.get(reverse("saved-view-open", args=[view.pk])).status_code == 404
    assert client.post(reverse("saved-view-delete", args=[view.pk])).status_code == 404
    assert SavedView.objects.filter(pk=view.pk).exists()


def test_a_person_deletes_their_own_view(client, db) -> None:
    ann = person("ann", "operator").user
    view = _saved(ann, "old", screen="attention")
    client.force_login(ann)
    response = client.post(reverse("saved-view-delete", args=[view.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("attention")
    assert not SavedView.objects.exists()


def test_deleting_a_view_is_a_post(client, db) -> None:
    ann = person("ann", "operator").user
    view = _saved(ann, "old")
    client.force_login(ann)
    assert client.get(reverse("saved-view-delete", args=[view.pk])).status_code == 405
    assert SavedView.objects.exists()


def test_saving_or_deleting_without_a_csrf_token_is_refused(db) -> None:
    ann = person("ann", "operator").user
    view = _saved(ann, "keep")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(ann)
    assert strict.post(reverse("saved-view-create"), {"name": "new", "screen": "task-list"}).status_code == 403
    assert strict.post(reverse("saved-view-delete", args=[view.pk])).status_code == 403
    assert list(SavedView.objects.values_list("name", flat=True)) == ["keep"]


def test_the_queues_only_accept_reads(admin, db) -> None:
    for url_name in QUEUES:
        assert admin.post(reverse(url_name)).status_code == 405


def test_attention_pages_skip_nothing_while_tasks_join_and_leave_the_queue(
    admin, make_task, clock, monkeypatch
) -> None:
    """Oldest waiting first: a task that starts waiting joins the end (shown once, on a later page); a task that
    stops waiting leaves without shifting the others (keyset, not offset)."""
    from console.views import queue as views

    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    waiting = []
    for _ in range(6):
        task = make_task()
        set_status(task, "human", updated_at=clock.now())
        waiting.append(task.pk)
        clock.advance(timedelta(seconds=1))
    seen: list[int] = []
    link: str | None = reverse("attention")
    joined: list[int] = []
    while link is not None:
        html = admin.get(link).content.decode()
        seen += [int(pk) for pk in re.findall(r'<tr data-task="(\d+)">', html)]
        found = re.search(r'href="([^"]*)" rel="next"', html)
        link = found.group(1).replace("&amp;", "&") if found else None
        clock.advance(timedelta(seconds=1))
        if len(joined) < 2:  # a task starts waiting between pages
            task = make_task()
            set_status(task, "paused", status_reason="needs_replan", updated_at=clock.now())
            joined.append(task.pk)
        # and the task the cursor names stops waiting (a person handed it back): the cursor holds values, not a row
        if seen[-1] in waiting:
            set_status(Task.objects.get(pk=seen[-1]), "running", updated_at=clock.now())
    assert seen == waiting + joined


def test_a_row_says_how_many_notes_its_task_has_and_links_to_them(admin, make_task, clock) -> None:
    noted = make_task(title="noted")
    make_task(title="quiet")
    writer = person("nora", "admin")
    for text in ("checked the store by hand", "waiting for the vendor"):
        task_note_add(actor=writer, task_id=noted.pk, text=text)
    html = admin.get(reverse("task-list")).content.decode()
    noted_row = html[html.index(">noted<") :].split("</tr>")[0]
    quiet_row = html[html.index(">quiet<") :].split("</tr>")[0]
    assert "2 notes" in noted_row and reverse("task-notes", args=[noted.pk]) in noted_row
    assert "note" not in quiet_row


def test_operators_and_admins_are_offered_bulk_actions_on_the_filtered_set_auditors_not(client, make_task) -> None:
    make_task()
    for role, offered in (("operator", True), ("admin", True), ("auditor", False)):
        client.force_login(person(f"{role}-b", role).user)
        html = client.get(reverse("task-list"), {"kind": "demo"}).content.decode()
        assert (f'href="{reverse("bulk")}?kind=demo"' in html) is offered, role
