"""A database that does not answer is the database's fault, not the request's: the adversarial review terminated the
app's PostgreSQL backends mid-run and got HTML "Server Error (500)" pages that no client retries. Here the web
connection's backend is really terminated (pg_terminate_backend, from another connection): the next API request is
503 problem+json with Retry-After, the console's a retry page (503), nothing is half-written, and the request after
it — on a new connection — is answered as usual.

The same for the two other ways PostgreSQL gives up on a statement, each provoked for real by a second connection
holding row locks: a statement timeout (the write waits on a row another transaction holds, past
``statement_timeout``) and a deadlock (the write holds the task's row and waits on a row the other transaction holds,
which then asks for the task's row: PostgreSQL ends the write's statement). Each is a 503 to retry on the API and
the retry page on the console; the write is rolled back whole, and its retry is served."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import close_old_connections, connection
from django.test import Client
from django.urls import reverse

from api.errors import CONTENT_TYPE
from api.tokens import api_token_issue
from audit.models import AuditEvent, AuditHead
from audit.services import GENESIS
from tasks.models import Node, Task
from tests.conftest import chain_plan, person
from tests.test_api_steps import KIND, Agent, created

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="terminates a PostgreSQL backend"),
]


def other_connection(*, autocommit: bool = True) -> psycopg.Connection[Any]:
    """A connection of its own to the test database, as another process would have."""
    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        dbname=settings["NAME"],
        autocommit=autocommit,
    )


def web_pid() -> int:
    connection.ensure_connection()
    pid: int = connection.connection.info.backend_pid
    return pid


def terminate_the_web_connection() -> None:
    """Kill the backend serving this process's connection, from a connection of its own (as a failover would)."""
    pid = web_pid()
    with other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@contextmanager
def web_session(setting: str, value: str) -> Iterator[None]:
    """A setting of the web connection's session (what a deployment would set in the connection's options)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET {setting} = %s", [value])  # the setting's name is this file's constant
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"RESET {setting}")


def _waits_on_a_lock(watcher: psycopg.Connection[Any], pid: int) -> bool:
    row = watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return row is not None and row[0] == "Lock"


@contextmanager
def holding(table: str, row_id: int) -> Iterator[psycopg.Connection[Any]]:
    """Another transaction holding ``row_id`` of ``table`` locked (FOR UPDATE) until the block ends."""
    with other_connection(autocommit=False) as other:
        other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [row_id])  # noqa: S608 (this file's names)
        try:
            yield other
        finally:
            other.rollback()


@contextmanager
def deadlocked_on(table: str, row_id: int, then_table: str, then_id: int) -> Iterator[threading.Thread]:
    """Another transaction holds ``then_table``'s row ``then_id``; once the web connection waits on a lock (on that
    row, holding ``table``'s row ``row_id``), it asks for ``row_id`` too: a deadlock. The web connection's
    deadlock_timeout is the shorter, so PostgreSQL ends the web's statement, not the other's. PostgreSQL looks for a
    deadlock once, when a waiter's deadlock_timeout runs out: the web's is long enough (1 s) for the circle to be
    closed by then on a loaded machine (at 50 ms the check could come first, find none, and leave it to the other's)."""
    pid = web_pid()
    errors: list[BaseException] = []

    def close_the_circle(other: psycopg.Connection[Any]) -> None:
        try:
            with other_connection() as watcher:
                deadline = time.monotonic() + 30
                while not _waits_on_a_lock(watcher, pid):
                    if time.monotonic() > deadline:
                        raise AssertionError("the web connection never waited on the held row")
                    time.sleep(0.01)
            other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [row_id])  # noqa: S608
        except BaseException as error:
            errors.append(error)

    with holding(then_table, then_id) as other:
        other.execute("SET deadlock_timeout = '15s'")
        circle = threading.Thread(target=close_the_circle, args=(other,))
        circle.start()
        # The statement timeout only turns a lock order that does not deadlock into a failure instead of a hang.
        with web_session("deadlock_timeout", "1s"), web_session("statement_timeout", "20s"):
            yield circle
        circle.join(30)
    assert not errors, errors


def request_finished() -> None:
    """What the end of every served request does (Django's request_finished → close_old_connections: a connection
    that failed is closed, the next request opens a new one); the test client leaves it out, so it is called here."""
    close_old_connections()


@pytest.fixture(autouse=True)
def _reconnect_for_the_teardown() -> Any:
    yield
    request_finished()


@pytest.fixture
def agent(client: Client) -> Agent:
    _, token = api_token_issue(actor=person("root", "admin"), agent_id="agent-7", kinds=[KIND], projects=())
    return Agent(client, token)


def test_a_lost_connection_is_a_503_the_client_retries_and_the_next_request_is_served(agent: Agent) -> None:
    task = created(agent, plan=chain_plan("a"))
    lease = agent.acquire(task["id"])["lease_id"]
    version = Task.objects.get(pk=task["id"]).version
    terminate_the_web_connection()

    lost: Any = agent.call("get", f"/tasks/{task['id']}/directive", Reckon_Lease=str(lease))

    assert lost.status_code == 503, lost.content
    assert lost["Content-Type"] == CONTENT_TYPE and lost["Retry-After"] == "1"
    assert lost.json()["code"] == "database_unavailable"
    request_finished()
    served = agent.call("get", f"/tasks/{task['id']}/directive", Reckon_Lease=str(lease))
    assert served.status_code == 200, served.content
    assert Task.objects.get(pk=task["id"]).version == version  # nothing half-written


def test_a_write_on_a_lost_connection_is_a_503_and_writes_nothing(agent: Agent) -> None:
    task = created(agent, plan=chain_plan("a"))
    lease = agent.acquire(task["id"])["lease_id"]
    d = agent.directive(task["id"], lease)
    terminate_the_web_connection()

    lost = agent.start(task["id"], lease, "a", d["task_version"])

    assert lost.status_code == 503 and lost.json()["code"] == "database_unavailable", lost.content
    request_finished()
    assert Task.objects.get(pk=task["id"]).version == d["task_version"]
    again = agent.start(task["id"], lease, "a", d["task_version"])  # the retry the 503 asks for
    assert again.status_code == 201, again.content


def test_the_console_answers_a_lost_connection_with_a_retry_page() -> None:
    client = Client(raise_request_exception=False)  # as a server answers: through handler500, not re-raised
    root = person("root", "admin")
    client.force_login(root.user)
    assert client.get(reverse("task-list")).status_code == 200
    terminate_the_web_connection()

    lost = client.get(reverse("task-list"))

    assert lost.status_code == 503 and lost["Retry-After"] == "1"
    assert "The database did not answer" in lost.content.decode()
    request_finished()
    assert client.get(reverse("task-list")).status_code == 200


def gave_up(caplog: pytest.LogCaptureFixture, why: str) -> bool:
    """The web request's statement was ended by PostgreSQL for ``why`` (its log line names the database's error)."""
    return any("database unavailable" in r.getMessage() and why in r.getMessage() for r in caplog.records)


TIMED_OUT = "canceling statement due to statement timeout"
DEADLOCK = "deadlock detected"


def test_a_statement_timeout_is_a_503_the_client_retries_and_writes_nothing(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    task = created(agent, plan=chain_plan("a"))
    lease = agent.acquire(task["id"])["lease_id"]
    d = agent.directive(task["id"], lease)

    with holding("tasks_task", task["id"]), web_session("statement_timeout", "200ms"):
        timed_out = agent.start(task["id"], lease, "a", d["task_version"])

    assert timed_out.status_code == 503, timed_out.content
    assert timed_out["Content-Type"] == CONTENT_TYPE and timed_out["Retry-After"] == "1"
    assert timed_out.json()["code"] == "database_unavailable" and gave_up(caplog, TIMED_OUT)
    request_finished()
    assert Task.objects.get(pk=task["id"]).version == d["task_version"]  # nothing half-written
    again = agent.start(task["id"], lease, "a", d["task_version"])
    assert again.status_code == 201, again.content


def test_a_deadlock_is_a_503_the_client_retries_and_writes_nothing(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """The intent's one statement updates the task's row and then its node's: the other transaction holds the
    node's row, and asks for the task's once the intent waits on the node's."""
    task = created(agent, plan=chain_plan("a"))
    lease = agent.acquire(task["id"])["lease_id"]
    d = agent.directive(task["id"], lease)
    node = Node.objects.get(task_id=task["id"], key="a")

    with deadlocked_on("tasks_task", task["id"], "tasks_node", node.pk):
        deadlocked = agent.start(task["id"], lease, "a", d["task_version"])

    assert deadlocked.status_code == 503, deadlocked.content
    assert deadlocked["Content-Type"] == CONTENT_TYPE and deadlocked["Retry-After"] == "1"
    assert deadlocked.json()["code"] == "database_unavailable" and gave_up(caplog, DEADLOCK)
    request_finished()
    assert Task.objects.get(pk=task["id"]).version == d["task_version"]
    assert Node.objects.get(pk=node.pk).status == node.status
    again = agent.start(task["id"], lease, "a", d["task_version"])
    assert again.status_code == 201, again.content


def cancel(client: Client, task: Task) -> Any:
    data = {"version": task.version, "reason": "the copy is no longer wanted", "confirm": str(task.pk)}
    return client.post(reverse("task-cancel", args=[task.pk]), data)


@pytest.fixture
def admin() -> Client:
    client = Client(raise_request_exception=False)  # as a server answers: through the middleware and handler500
    client.force_login(person("ada", "admin").user)
    return client


def test_the_console_answers_a_statement_timeout_with_a_retry_page_and_writes_nothing(
    admin: Client, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    task = Task.objects.get(pk=created(agent, plan=chain_plan("a"))["id"])

    with holding("tasks_task", task.pk), web_session("statement_timeout", "200ms"):
        timed_out = cancel(admin, task)

    assert timed_out.status_code == 503 and timed_out["Retry-After"] == "1", timed_out.content[:300]
    assert "The database did not answer" in timed_out.content.decode() and gave_up(caplog, TIMED_OUT)
    request_finished()
    assert Task.objects.get(pk=task.pk).version == task.version
    assert cancel(admin, task).status_code == 303  # the retry the page offers


def test_the_console_answers_a_deadlock_with_a_retry_page_and_writes_nothing(
    admin: Client, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancel updates the task's row, then appends to the audit chain under its head's row lock: the other
    transaction holds the head, and asks for the task's row once the cancel waits on the head."""
    task = Task.objects.get(pk=created(agent, plan=chain_plan("a"))["id"])
    audit_lock_row = AuditHead.objects.get_or_create(pk=1, defaults={"seq": 0, "digest": GENESIS})[0]
    audit_events = AuditEvent.objects.count()

    with deadlocked_on("tasks_task", task.pk, "audit_audithead", audit_lock_row.pk):
        deadlocked = cancel(admin, task)

    assert deadlocked.status_code == 503 and deadlocked["Retry-After"] == "1", deadlocked.content[:300]
    assert "The database did not answer" in deadlocked.content.decode() and gave_up(caplog, DEADLOCK)
    request_finished()
    assert Task.objects.get(pk=task.pk).version == task.version and AuditEvent.objects.count() == audit_events
    assert cancel(admin, task).status_code == 303
