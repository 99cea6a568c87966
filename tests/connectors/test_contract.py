"""One contract, three connectors — PostgreSQL (a ledger in the target's transaction), S3 (a conditional claim, then a
conditional write) and an HTTP API with an Idempotency-Key — each against a real server (tests/connectors/remotes.py).

Every test tries to make one op key's write land twice, or to make an answer deny a write that landed: sent twice, sent
twice at once, its answer lost, its sender killed, fenced and then sent, sent late or held until late. The effect is
always counted at the remote itself.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reckon_client import Committed, Connector, Deleting, Failed, Fenced, Fencing, NotFound, Outcome
from reckon_client.connectors import SourceNotFound

from tests.connectors.checks import committed, failed, in_thread, race, wait_until
from tests.connectors.remotes import Remote, deadline, op_key

ROOT = Path(__file__).resolve().parents[2]
# How long the proxy holds each answer while the test waits for the effect to show at the remote and then cuts the
# connection: the answer to the write that made it is still held, and is lost. A machine too busy to see the effect
# within the delay lets the answer through; the test then tries again with a longer one.
ANSWER_DELAYS_MS = (250, 1000, 3000)


def test_every_connector_satisfies_the_clients_protocols(remote: Remote) -> None:
    connector = remote.connector()
    assert isinstance(connector, Connector) and isinstance(connector, Fencing) and isinstance(connector, Deleting)


def test_a_second_submit_under_one_op_key_makes_no_second_effect(remote: Remote) -> None:
    connector, request, key = remote.connector(), remote.write(), op_key()
    first = committed(connector.submit(key, request))
    assert connector.submit(key, request) == first
    # Sent again by another process, with the new deadline Reckon gives every re-send: the same write.
    assert remote.connector().submit(key, request | {"not_after": deadline(60)}) == first
    assert remote.effects(request) == 1
    assert connector.lookup(key) == first


def test_two_submits_of_one_op_key_at_once_make_one_effect(remote: Remote) -> None:
    request, key = remote.write(), op_key()
    answers = race(*[lambda: remote.connector().submit(key, request)] * 2)
    # The one that lost the race waits and replays, or is told the other is in flight (unknown: looked up later).
    for answer in answers:
        assert isinstance(answer, Committed) or failed(answer, "connection_interrupted"), answer
    settled = committed(remote.connector().lookup(key))
    assert all(answer == settled for answer in answers if isinstance(answer, Committed))
    assert remote.effects(request) == 1


def lose_the_answer(remote: Remote) -> tuple[dict[str, Any], str, Outcome]:
    """A write that lands at the remote while its answer never reaches the connector: (request, op key, outcome)."""
    for delay in ANSWER_DELAYS_MS:
        connector, request, key = remote.connector(), remote.write(), op_key()
        remote.proxy.latency(delay, "down")
        thread, answer = in_thread(lambda: connector.submit(key, request))  # noqa: B023 - joined in this iteration
        wait_until(lambda: remote.effects(request) == 1)  # noqa: B023
        remote.proxy.cut()  # the write landed; its answer is still held by the proxy, and now lost
        thread.join(30)
        remote.proxy.heal()
        if not isinstance(answer[0], Committed):
            return request, key, answer[0]
    raise AssertionError(f"every answer arrived before the cut, even {ANSWER_DELAYS_MS[-1]} ms late")


def test_a_lost_answer_is_settled_by_lookup(remote: Remote) -> None:
    request, key, outcome = lose_the_answer(remote)
    failed(outcome, "connection_interrupted")
    settled = committed(remote.connector().lookup(key))
    assert remote.connector().submit(key, request) == settled
    assert remote.effects(request) == 1


def test_a_fenced_op_key_refuses_a_late_submit_with_no_effect(remote: Remote) -> None:
    connector, request, key = remote.connector(), remote.write(), op_key()
    assert connector.fence(key) == Fenced()
    assert connector.submit(key, request) == Fenced()
    assert remote.connector().submit(key, request | {"not_after": deadline(60)}) == Fenced()
    assert remote.effects(request) == 0
    assert connector.lookup(key) == Fenced()
    assert connector.fence(key) == Fenced()


def test_a_fence_of_an_op_that_took_effect_answers_its_receipt(remote: Remote) -> None:
    connector, request, key = remote.connector(), remote.write(), op_key()
    receipt = committed(connector.submit(key, request))
    assert remote.connector().fence(key) == receipt
    assert connector.lookup(key) == receipt
    assert connector.submit(key, request) == receipt
    assert remote.effects(request) == 1


def test_a_crash_between_the_submit_and_its_record_is_settled_by_lookup(remote: Remote) -> None:
    """The submit runs in a process killed (SIGKILL) the moment its write shows at the remote: it may not even have
    its answer yet, and it certainly records nothing. A new connector's lookup settles the operation."""
    request, key = remote.write(), op_key()
    order = json.dumps({"connector": remote.spec(), "op_key": key, "request": request})
    child = subprocess.Popen(  # noqa: S603 - this interpreter, this repository's module, the test's own order
        [sys.executable, "-m", "tests.connectors.submit_child", order],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None
        ready = child.stdout.readline().strip()
        assert ready == "ready", child.stderr.read() if child.stderr else ready
        wait_until(lambda: remote.effects(request) == 1, timeout=30)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL

    settled = committed(remote.connector().lookup(key))
    assert remote.effects(request) == 1
    assert remote.connector().submit(key, request) == settled
    assert remote.effects(request) == 1


def test_a_request_past_its_deadline_is_refused_with_no_effect(remote: Remote) -> None:
    connector, key = remote.connector(), op_key()
    request = remote.write(not_after=deadline(-1))
    failed(connector.submit(key, request), "dependency_unavailable")
    assert remote.effects(request) == 0
    assert connector.lookup(key) == NotFound()
    # Refused, not remembered: the same op key sent again in time writes once.
    committed(connector.submit(key, request | {"not_after": deadline()}))
    assert remote.effects(request) == 1


def test_a_request_whose_deadline_passes_on_the_way_is_refused_with_no_effect(remote: Remote) -> None:
    connector, key = remote.connector(), op_key()
    request = remote.write(not_after=deadline(0.15))
    remote.proxy.latency(200, "up")  # every request reaches the remote 200 ms late
    failed(connector.submit(key, request), "dependency_unavailable")
    remote.proxy.heal()
    assert remote.effects(request) == 0
    assert remote.connector().lookup(key) == NotFound()
    committed(remote.connector().submit(key, request | {"not_after": deadline()}))
    assert remote.effects(request) == 1


def test_an_op_key_sent_with_another_request_is_refused(remote: Remote) -> None:
    connector, request, other, key = remote.connector(), remote.write(), remote.write(), op_key()
    receipt = committed(connector.submit(key, request))
    failed(connector.submit(key, other), "invalid_params")
    assert (remote.effects(request), remote.effects(other)) == (1, 0)
    assert connector.lookup(key) == receipt


def test_current_version_changes_with_the_source(remote: Remote) -> None:
    connector = remote.connector()
    before = connector.current_version(remote.source_locator)
    assert connector.current_version(remote.source_locator) == before
    remote.change_source()
    assert connector.current_version(remote.source_locator) != before
    with pytest.raises(SourceNotFound):
        connector.current_version(remote.missing_locator)


MALFORMED: list[Any] = [
    None,
    [],
    "copy everything",
    {},
    {"input": {}},
    {"action": 7, "input": {}},
    {"action": "", "input": {}},
    {"action": "x", "input": []},
    {"action": "x", "input": {}, "not_after": "yesterday"},
    {"action": "x", "input": {}, "not_after": "2026-01-01T00:00:00"},  # no UTC offset
    {"action": "x", "input": {"value": float("nan")}},
]
BAD_OP_KEYS: list[Any] = ["", "two words", "line\nbreak", "x" * 300, "ünïcode", None, 7]


def test_bad_input_is_invalid_params_and_never_an_exception(remote: Remote) -> None:
    connector = remote.connector()
    for bad in remote.bad_requests() + MALFORMED:
        key = op_key()
        outcome = connector.submit(key, bad)
        assert isinstance(outcome, Failed) and outcome.failure_class == "invalid_params", (bad, outcome)
        assert connector.lookup(key) == NotFound(), bad
    request = remote.write()
    for key in BAD_OP_KEYS:
        failed(connector.submit(key, request), "invalid_params")
        assert connector.lookup(key) == NotFound()
        assert connector.fence(key) == Fenced()
    assert remote.effects(request) == 0


def test_the_client_imports_neither_psycopg_nor_boto3() -> None:
    """``import reckon_client`` (and the connectors' package) works without the connectors' extras installed."""
    check = (
        "import sys, reckon_client, reckon_client.connectors, reckon_client.connectors.http; "
        "loaded = {'psycopg', 'boto3', 'botocore'} & set(sys.modules); assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", check], check=True, cwd=ROOT)  # noqa: S603 - this interpreter, fixed code
