"""/healthz and /readyz: open without a login, disclosing nothing but a status word per check, and 503 naming the
check when the database or the broker cannot be reached (a real refused connection, not a mock)."""

import json

import pytest
from django.test import Client, override_settings

from harness.ports import free_port

pytestmark = pytest.mark.django_db


def test_liveness_answers_without_a_login_and_touches_nothing(client: Client, django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


def test_readiness_checks_the_database_and_the_broker(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}


def test_a_broker_that_refuses_makes_it_unready_and_says_nothing_of_where(client: Client) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(CELERY_BROKER_URL=url, CELERY_BROKER_TRANSPORT_OPTIONS={}):
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "checks": {"database": "ok", "broker": "failing"}}
    assert "127.0.0.1" not in response.content.decode() and "redis" not in json.dumps(response.json())


def test_only_get_is_answered(client: Client) -> None:
    assert client.post("/readyz").status_code == 405
    assert client.post("/healthz").status_code == 405
