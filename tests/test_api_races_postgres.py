"""Real races through the agent API on PostgreSQL: threads, each on its own connection, send the same request at
once. Every write really commits, so the unique index on (agent, Idempotency-Key) and the task's compare-and-set
are what decide."""

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from api.models import IdempotencyRecord
from api.tokens import api_token_issue
from tasks.models import Operation, Task
from tests.conftest import chain_plan, person

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL for real concurrent writers"),
]

THREADS = 6


def at_once(call: Any) -> list[Any]:
    barrier = threading.Barrier(THREADS)
    answers: list[Any] = [None] * THREADS

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=20)
            answers[i] = call()
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return answers


def headers(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def test_the_same_create_sent_at_once_makes_one_task_and_every_sender_gets_it() -> None:
    token = api_token_issue(actor=person("root", "admin"), agent_id="racer", kinds=["copy"], projects=[])[1]
    body = {"kind": "copy", "title": "raced", "plan": chain_plan("a", "b")}

    def create() -> Any:
        return Client().post(
            "/api/v1/tasks", body, content_type="application/json", headers=headers(token, **{"Idempotency-Key": "r1"})
        )

    answers = at_once(create)
    assert [a.status_code for a in answers] == [201] * THREADS
    assert Task.objects.filter(title="raced").count() == 1
    assert len({a.json()["id"] for a in answers}) == 1
    assert IdempotencyRecord.objects.count() == 1


def test_the_same_intent_sent_at_once_registers_one_operation() -> None:
    token = api_token_issue(actor=person("root", "admin"), agent_id="racer", kinds=["copy"], projects=[])[1]
    client = Client()
    task = client.post(
        "/api/v1/tasks",
        {"kind": "copy", "title": "t", "plan": chain_plan("a")},
        content_type="application/json",
        headers=headers(token),
    ).json()
    lease = client.post(
        f"/api/v1/tasks/{task['id']}/lease", {}, content_type="application/json", headers=headers(token)
    ).json()

    def start() -> Any:
        return Client().post(
            f"/api/v1/tasks/{task['id']}/operations",
            {"node_key": "a"},
            content_type="application/json",
            headers=headers(token, **{"Reckon-Lease": str(lease["lease_id"]), "If-Match": str(task["version"])}),
        )

    answers = at_once(start)
    statuses = sorted(a.status_code for a in answers)
    # Without a key: exactly one compare-and-set wins; the others are told the task moved (412), never a 5xx.
    assert statuses.count(201) == 1 and set(statuses) <= {201, 412}, [a.content for a in answers]
    assert Operation.objects.filter(task_id=task["id"]).count() == 1
