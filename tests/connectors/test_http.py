"""What is the HTTP connector's own, against harness/idempotent_api.py on a real port: 422 for a key reused with
another body, 409 while the key's first request is in flight, a 5xx or a timeout after the effect settled by lookup,
the deadline judged at the effect, and what an API without a lookup or a fence route can and cannot say."""

from datetime import UTC, datetime

import httpx
from reckon_client import Fenced, NotFound, Unprovable
from reckon_client.connectors.http import HttpApi, HttpConnector

from harness.idempotent_api import IdempotentApi
from harness.ports import free_port
from tests.connectors.checks import committed, failed, in_thread, wait_until
from tests.connectors.remotes import HttpRemote, deadline, op_key
from tests.connectors.specs import HARNESS_API


def test_a_key_reused_with_another_body_is_refused_422(http: HttpRemote) -> None:
    request, key = http.write(), op_key()
    committed(http.connector().submit(key, request))
    other = request | {"input": request["input"] | {"amount": 999}}
    raw = httpx.post(f"{http.api.url}/v1/transfers", json=other["input"], headers={"Idempotency-Key": key})
    assert raw.status_code == 422
    failed(http.connector().submit(key, other), "invalid_params")
    assert http.effects(request) == 1


def test_a_request_while_the_keys_first_is_in_flight_is_409_and_lookup_waits_for_it(http: HttpRemote) -> None:
    request, key = http.write(), op_key()
    http.api.pause()
    thread, first = in_thread(lambda: http.connector().submit(key, request))
    wait_until(lambda: http.api.held() == 1)
    second = failed(http.connector().submit(key, request), "connection_interrupted")
    assert "in flight" in second.detail
    failed(http.connector().lookup(key), "connection_interrupted")  # unknown yet: never "not found"
    failed(http.connector().fence(key), "connection_interrupted")
    http.api.resume()
    thread.join(30)
    receipt = committed(first[0])
    assert http.connector().lookup(key) == receipt
    assert http.effects(request) == 1


def test_a_5xx_after_the_effect_is_unknown_and_lookup_settles_it(http: HttpRemote) -> None:
    request, key = http.write(), op_key()
    http.api.fail_after_effect(1)
    failed(http.connector().submit(key, request), "connection_interrupted")
    receipt = committed(http.connector().lookup(key))
    assert http.connector().submit(key, request) == receipt
    assert http.effects(request) == 1


def test_a_timeout_is_unknown_and_lookup_settles_it(http: HttpRemote) -> None:
    request, key = http.write(), op_key()
    http.api.stall_answers(1.0)
    failed(http.connector(timeout=0.3).submit(key, request), "connection_interrupted")
    http.api.stall_answers(0)
    receipt = committed(http.connector().lookup(key))
    assert http.effects(request) == 1
    assert http.connector().submit(key, request) == receipt


def test_a_request_held_in_flight_past_its_deadline_is_refused_at_the_effect(http: HttpRemote) -> None:
    not_after = deadline(1.0)
    request, key = http.write(not_after=not_after), op_key()
    http.api.pause()
    thread, answer = in_thread(lambda: http.connector().submit(key, request))
    wait_until(lambda: http.api.held() == 1)
    wait_until(lambda: datetime.now(UTC) > datetime.fromisoformat(not_after))
    http.api.resume()
    thread.join(30)
    failed(answer[0], "dependency_unavailable")
    assert http.effects(request) == 0
    assert http.connector().lookup(key) == NotFound()  # past its deadline: final


def test_an_api_without_a_lookup_route_cannot_settle_a_lost_answer(http: HttpRemote) -> None:
    blind = HttpApi(actions=HARNESS_API.actions)
    request, key = http.write(), op_key()
    http.api.fail_after_effect(1)
    failed(http.connector(api=blind).submit(key, request), "connection_interrupted")
    assert isinstance(http.connector(api=blind).lookup(key), Unprovable)
    assert isinstance(http.connector(api=blind).fence(key), Unprovable)


def test_an_api_without_a_fence_route_answers_a_fence_as_a_lookup(http: HttpRemote) -> None:
    unfenced = HttpApi(actions=HARNESS_API.actions, lookup=HARNESS_API.lookup)
    request, key = http.write(), op_key()
    assert http.connector(api=unfenced).fence(key) == NotFound()  # final only past the deadline
    committed(http.connector(api=unfenced).submit(key, request))  # nothing was fenced
    assert http.effects(request) == 1


def test_a_compensation_is_an_action_of_its_own_once_per_op_key(http: HttpRemote) -> None:
    connector, key = http.connector(), op_key()
    transfer = committed(connector.submit(op_key(), http.write()))
    reverse = {"action": "reverse", "input": {"id": transfer.remote_id}, "not_after": deadline()}
    receipt = committed(connector.compensate(key, reverse))
    assert connector.compensate(key, reverse) == receipt
    assert http.api.reversals[transfer.remote_id] == 1


def test_delete_removes_one_resource_once_per_op_key(http: HttpRemote) -> None:
    connector, key = http.connector(), op_key()
    transfer = committed(connector.submit(op_key(), http.write()))
    receipt = committed(connector.delete(key, transfer.remote_id))
    assert (receipt.remote_id, receipt.count) == (transfer.remote_id, 1)
    assert connector.delete(key, transfer.remote_id) == receipt
    assert committed(connector.delete(op_key(), transfer.remote_id)).count == 0


def test_an_api_that_cannot_be_reached_refuses_a_write_and_leaves_a_query_unknown(api: IdempotentApi) -> None:
    nowhere = HttpConnector(f"http://127.0.0.1:{free_port()}", HARNESS_API, timeout=2.0)
    request = {"action": "transfer", "input": {"ref": "r", "amount": 1, "to": "a"}, "not_after": deadline()}
    failed(nowhere.submit(op_key(), request), "dependency_unavailable")  # never sent: nothing can have happened
    failed(nowhere.lookup(op_key()), "connection_interrupted")
    assert nowhere.fence(op_key()) != Fenced()
