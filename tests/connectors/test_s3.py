"""What is the S3 connector's own: the claim decides a race between a fence and a submit, the write is conditional so
a copy sent again lands nothing twice, and a claim whose write never landed is "not found" until its deadline, then
unprovable — never "not found" when a late write could still land."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from reckon_client import Fenced, NotFound, Unprovable

from tests.connectors.checks import committed, failed, submit_against_fence
from tests.connectors.remotes import BUCKET, SOURCE_KEY, S3Remote, deadline, op_key


def claim_of(s3: S3Remote, key: str) -> dict[str, Any]:
    answer = s3.admin.get_object(Bucket=BUCKET, Key=f"reckon/.reckon/ops/{quote(key, safe='')}")
    claim: dict[str, Any] = json.loads(answer["Body"].read())
    return claim


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def claimed_but_not_written(s3: S3Remote) -> tuple[dict[str, Any], str]:
    """A claim whose write never landed: the request's deadline passes between its claim and its write (every request
    reaches S3 200 ms late), so the connector refuses to write."""
    request, key = s3.write(not_after=deadline(0.15)), op_key()
    s3.proxy.latency(200, "up")
    failed(s3.connector().submit(key, request), "dependency_unavailable")
    s3.proxy.heal()
    assert claim_of(s3, key)["state"] == "claimed"
    assert s3.effects(request) == 0
    return request, key


# (submit's delay, fence's delay) after both threads are ready: from one clearly first to a true race.
HEAD_STARTS = [(0.3, 0.0), (0.0, 0.3), (0.0, 0.0), (0.004, 0.0), (0.0, 0.004), (0.008, 0.0), (0.0, 0.0), (0.002, 0.0)]


def test_a_fence_and_a_submit_racing_for_one_op_key_never_both_win(s3: S3Remote) -> None:
    wins = {"submit": 0, "fence": 0}
    for head_starts in HEAD_STARTS:
        request, key = s3.write(), op_key()
        writer, fencer = s3.connector(), s3.connector()
        submitted, fenced = submit_against_fence(writer, fencer, key, request, delays=head_starts)
        if fenced == Fenced():
            wins["fence"] += 1
            assert submitted == Fenced() and s3.effects(request) == 0
            assert s3.connector().submit(key, request | {"not_after": deadline()}) == Fenced()
        else:
            wins["submit"] += 1
            receipt = committed(submitted)
            # The fence read the claim before or after the write landed: "not yet" (not final), or the receipt.
            assert fenced in (receipt, NotFound()), fenced
            assert s3.connector().fence(key) == receipt and s3.effects(request) == 1
    assert wins["submit"] and wins["fence"], wins


def test_a_claim_whose_write_never_landed_is_not_found_until_its_deadline_then_unprovable(s3: S3Remote) -> None:
    request, key = claimed_but_not_written(s3)
    assert s3.connector().lookup(key) == NotFound()  # a write may still be on its way: not final, safe to resend
    assert s3.connector().fence(key) == NotFound()  # a fence cannot stop a claimed write
    past_the_deadline = s3.connector(clock=lambda: later(10), skew=5)
    assert isinstance(past_the_deadline.lookup(key), Unprovable)
    assert isinstance(past_the_deadline.fence(key), Unprovable)
    assert s3.effects(request) == 0

    # Sent again with a new deadline: the claim is this op key's, the conditional write lands once.
    receipt = committed(s3.connector().submit(key, request | {"not_after": deadline()}))
    assert s3.effects(request) == 1
    assert past_the_deadline.lookup(key) == receipt
    assert claim_of(s3, key)["state"] == "written"


def test_a_resend_moves_the_claims_deadline_to_its_own(s3: S3Remote) -> None:
    request, key = claimed_but_not_written(s3)
    first = datetime.fromisoformat(claim_of(s3, key)["not_after"])
    s3.admin.put_object(Bucket=BUCKET, Key=request["input"]["key"], Body=b"someone else's")
    resent = deadline(60)
    failed(s3.connector().submit(key, request | {"not_after": resent}), "conflict")
    assert datetime.fromisoformat(claim_of(s3, key)["not_after"]) == datetime.fromisoformat(resent) > first
    # Past the first deadline, within the second: still "not yet" rather than unprovable.
    assert s3.connector(clock=lambda: later(10), skew=5).lookup(key) == NotFound()


def test_a_resend_after_a_crash_between_the_write_and_its_record_lands_nothing_twice(s3: S3Remote) -> None:
    request, key = s3.write(), op_key()
    receipt = committed(s3.connector().submit(key, request))
    # The claim as a submitter killed between its write and the claim's update left it: claimed, not written.
    claim = claim_of(s3, key) | {"state": "claimed", "receipt": None}
    s3.admin.put_object(Bucket=BUCKET, Key=f"reckon/.reckon/ops/{quote(key, safe='')}", Body=json.dumps(claim))
    assert s3.connector().submit(key, request | {"not_after": deadline(60)}) == receipt  # refused by If-None-Match
    assert s3.effects(request) == 1
    assert claim_of(s3, key)["state"] == "written"


def test_a_target_someone_else_wrote_is_a_conflict_and_is_not_overwritten(s3: S3Remote) -> None:
    request, key = s3.write(), op_key()
    s3.admin.put_object(Bucket=BUCKET, Key=request["input"]["key"], Body=b"someone else's")
    failed(s3.connector().submit(key, request), "conflict")
    assert s3.admin.get_object(Bucket=BUCKET, Key=request["input"]["key"])["Body"].read() == b"someone else's"
    assert s3.effects(request) == 1  # theirs only


def test_replaces_overwrites_only_the_version_named_and_the_first_write_stays_on_record(s3: S3Remote) -> None:
    connector = s3.connector()
    request, first_key = s3.write(), op_key()
    first = committed(connector.submit(first_key, request))
    replacing = request | {"input": request["input"] | {"body": "second", "replaces": first.remote_version}}
    second = committed(connector.submit(op_key(), replacing))
    assert second.remote_version != first.remote_version
    stale = request | {"input": request["input"] | {"body": "third", "replaces": first.remote_version}}
    failed(connector.submit(op_key(), stale), "conflict")
    assert s3.effects(request) == 2
    assert s3.connector().lookup(first_key) == first  # recorded on its claim: the overwrite does not hide it


def test_copy_reads_the_source_at_the_version_named(s3: S3Remote) -> None:
    connector = s3.connector()
    version = connector.current_version(SOURCE_KEY)
    body = s3.admin.get_object(Bucket=BUCKET, Key=SOURCE_KEY)["Body"].read()
    target = f"copies/{op_key()}.txt"
    copy: dict[str, Any] = {"action": "copy", "input": {"source": SOURCE_KEY, "source_version": version, "key": target}}
    committed(connector.submit(op_key(), copy | {"not_after": deadline()}))
    assert s3.admin.get_object(Bucket=BUCKET, Key=target)["Body"].read() == body
    s3.change_source()
    moved = copy | {"input": copy["input"] | {"key": f"copies/{op_key()}.txt"}}
    failed(connector.submit(op_key(), moved), "conflict")


def test_delete_removes_one_object_once_per_op_key(s3: S3Remote) -> None:
    connector, key = s3.connector(), op_key()
    request = s3.write()
    committed(connector.submit(op_key(), request))
    target = request["input"]["key"]
    receipt = committed(connector.delete(key, target))
    assert (receipt.remote_id, receipt.count) == (f"s3://{BUCKET}/{target}", 1)
    assert connector.delete(key, target) == receipt
    assert connector.lookup(key) == receipt
    assert committed(connector.delete(op_key(), target)).count == 0
    assert "Contents" not in s3.admin.list_objects_v2(Bucket=BUCKET, Prefix=target)


def test_a_prefix_has_a_version_of_its_listing(s3: S3Remote) -> None:
    connector = s3.connector()
    before = connector.current_version("sources/")
    assert before.startswith("sha256:") and connector.current_version("sources/") == before
    s3.change_source()
    assert connector.current_version("sources/") != before


def test_the_bucket_has_conditional_writes(s3: S3Remote) -> None:
    s3.connector().verify_conditional_writes()
