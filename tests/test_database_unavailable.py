"""A database that does not answer is the database's fault, not the request's: the adversarial review terminated the
app's PostgreSQL backends mid-run and got HTML "Server Error (500)" pages that no client retries. Here the web
connection's backend is really terminated (pg_terminate_backend, from another connection): the next API request is
503 problem+json with Retry-After, the console's a retry page (503), nothing is half-written, and the request after
it — on a new connection — is answered as usual."""

from typing import Any

import psycopg
import pytest
from django.db import close_old_connections, connection
from django.test import Client
from django.urls import reverse

from api.errors import CONTENT_TYPE
from api.tokens import api_token_issue
from tasks.models import Task
from tests.conftest import chain_plan, person
from tests.test_api_steps import KIND, Agent, created

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="terminates a PostgreSQL backend"),
]


def terminate_the_web_connection() -> None:
    """Kill the backend serving this process's connection, from a connection of its own (as a failover would)."""
    pid = connection.connection.info.backend_pid
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        dbname=settings["NAME"],
        autocommit=True,
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


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
