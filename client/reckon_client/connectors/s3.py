"""S3-compatible object storage (boto3): put, copy or delete an object once per op key — AWS S3, MinIO, Ceph RGW.

    from reckon_client.connectors.s3 import S3Connector

    s3 = S3Connector.connect("migrated", endpoint_url="https://minio.internal:9000", prefix="reckon")
    s3.verify_conditional_writes()   # once, at start-up: the rule below needs them
    s3.submit(op_key, {"action": "copy", "not_after": "2026-01-01T00:00:30+00:00",
                       "input": {"source": "acme/1.json", "key": "acme-v2/1.json"}})

It needs conditional writes on PutObject (``If-None-Match: *`` and ``If-Match``: AWS S3 since 2024, MinIO, recent
Ceph RGW). S3 has no transaction across two objects, so the rule is built from two conditional writes:

- **The claim** ``<prefix>/.reckon/ops/<op_key>`` (JSON) decides between a write and a fence: both create it with
  ``If-None-Match: *``, and whoever creates it first wins. A submit's claim (``claimed``) names the target key, the
  request's digest, the content's digest, the target's state the write expects and the deadline; a fence's says
  ``fenced``, and every later submit under that key answers ``Fenced`` with no effect. A claim only ever goes
  absent → claimed → written (with the receipt), or absent → fenced.
- **The write** is conditional on the target's state the claim names (absent: ``If-None-Match: *``; an ETag given as
  ``replaces``: ``If-Match``) and carries the op key in the object's metadata (``reckon-op-key``). However many copies
  of one op key's write are in flight or sent again, at most one lands; a copy refused by the precondition looks at
  the target and answers ``Committed`` when the op key there is its own, ``conflict`` otherwise.

**The deadline**: the connector refuses a request past ``not_after``, by its own clock, before the claim and again
before the write (``Failed("dependency_unavailable")``: that copy wrote nothing).

**A claim whose write has not landed** (its submitter died or was cut off between the two PUTs, or refused its write
for the deadline) is

- ``NotFound`` until the claim's deadline plus ``skew``: a write may still be on its way, which Reckon allows for
  until then; sending the op key again is safe because the write is conditional, and a re-send moves the claim's
  deadline to its own;
- ``Unprovable`` after it: S3 cannot refuse a PUT by a deadline, and one sent before the deadline may still land
  later (a TCP retransmission after a partition heals), so nothing here can say "never". A person looks at the claim,
  which names the object, and settles the operation.

``fence`` answers a claimed key the same way: it cannot stop a write already claimed. A key without a claim is fenced
at once, and no submit can claim it afterwards. ``lookup`` and ``fence`` record a landed write on its claim, so that a
later overwrite of the object (a next step's ``replaces``) does not hide it.

Actions: ``put`` ``{"key", "body": <text>, "content_type"?, "replaces"?: <ETag>}``; ``copy`` ``{"source", "key",
"source_version"?: <ETag>, "replaces"?}`` (read from ``source_bucket``; a source that is not at ``source_version`` is
a ``conflict``); ``delete`` ``{"key"}`` (also ``delete(op_key, locator)``). A receipt: ``remote_id``
``s3://<bucket>/<key>``, ``remote_version`` the object's ETag, ``digest`` ``sha256:<hex>`` of its content, ``count``
the objects written or removed. ``current_version(key)`` is the object's ETag; of a prefix ending in ``/``, sha256 over
its listing's keys and ETags.
"""

import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, cast
from urllib.parse import quote
from uuid import uuid4

import boto3  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ParamValidationError,
)

from reckon_client.connectors.common import (
    InvalidRequest,
    SourceNotFound,
    WriteRequest,
    op_key_problem,
    optional_text,
    parse_deadline,
    seconds,
    text_field,
    utc_now,
)
from reckon_client.outcomes import Committed, Failed, FailureClass, Fenced, NotFound, Outcome, Unprovable

ABSENT = "absent"  # the state a write expects of a target that must not exist yet
OP_KEY_METADATA = "reckon-op-key"
DIGEST_METADATA = "reckon-digest"
_LATE = "the request is past its deadline (not_after): refused before writing, no effect"

type Action = Literal["put", "copy", "delete"]
type ClaimState = Literal["claimed", "written", "fenced"]


class ConditionalWritesUnsupported(RuntimeError):
    """The bucket ignores ``If-None-Match: *`` on PutObject: this connector cannot keep its rule there."""


class _Answer(Exception):
    """Stop here and answer ``outcome``."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class _NotSent(Exception):
    """The request never left (no connection): nothing can have happened."""


class _NoAnswer(Exception):
    """The request may have reached S3; no answer came back."""


class _S3Error(Exception):
    """S3 answered with an error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, code, message)
        self.status, self.code, self.message = status, code, message

    @classmethod
    def of(cls, exc: Any) -> "_S3Error":
        response = getattr(exc, "response", {}) or {}
        error = response.get("Error", {}) or {}
        status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        return cls(status, str(error.get("Code", "")), str(error.get("Message", "")))

    @property
    def failure(self) -> FailureClass:
        """DESIGN §7's classes for a write S3 refused. A 5xx other than 503 says nothing about whether it landed."""
        if self.status in (401, 403):
            return "permission_revoked"
        if self.status in (429, 503) or self.code in ("SlowDown", "OperationAborted"):
            return "dependency_unavailable"
        if 400 <= self.status < 500:
            return "invalid_params"
        return "connection_interrupted"

    def __str__(self) -> str:
        return f"S3 {self.status} {self.code}: {self.message}"[:300]


@dataclass(frozen=True)
class _Write:
    action: Action
    key: str
    expect: str = ABSENT  # the target's state the write is conditional on: ABSENT or an ETag
    body: str | None = None
    content_type: str = "application/octet-stream"
    source: str | None = None
    source_version: str | None = None


@dataclass(frozen=True)
class _Content:
    body: bytes
    digest: str
    content_type: str


@dataclass(frozen=True)
class _Claim:
    state: ClaimState
    action: Action
    key: str
    request: str
    digest: str
    expect: str
    not_after: datetime | None
    receipt: Committed | None = None
    etag: str = field(default="", compare=False)

    def document(self) -> bytes:
        receipt = self.receipt
        return json.dumps(
            {
                "state": self.state,
                "action": self.action,
                "key": self.key,
                "request": self.request,
                "digest": self.digest,
                "expect": self.expect,
                "not_after": self.not_after.isoformat() if self.not_after else None,
                "receipt": None
                if receipt is None
                else {
                    "remote_id": receipt.remote_id,
                    "remote_version": receipt.remote_version,
                    "count": receipt.count,
                    "digest": receipt.digest,
                },
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def read(cls, raw: bytes, etag: str) -> "_Claim":
        document = json.loads(raw)
        if document.get("state") not in ("claimed", "written", "fenced"):
            raise ValueError(f"claim state {document.get('state')!r}")
        receipt = document.get("receipt")
        return cls(
            state=document["state"],
            action=document.get("action", "put"),
            key=str(document.get("key", "")),
            request=str(document.get("request", "")),
            digest=str(document.get("digest", "")),
            expect=str(document.get("expect", ABSENT)),
            not_after=parse_deadline(document.get("not_after")),
            receipt=None
            if receipt is None
            else Committed(
                remote_id=str(receipt["remote_id"]),
                remote_version=str(receipt.get("remote_version") or ""),
                count=receipt.get("count"),
                digest=str(receipt.get("digest") or ""),
            ),
            etag=etag,
        )


class S3Connector:
    """One bucket of an S3-compatible store, through a boto3 S3 ``client`` that must not retry on its own (every send
    is the connector's to judge against the deadline): ``S3Connector.connect`` makes one. Satisfies
    ``reckon_client.Connector``, ``Fencing`` and ``Deleting``."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        *,
        prefix: str = "",
        source_bucket: str | None = None,
        skew: float | timedelta = 5.0,
        max_bytes: int = 64 * 2**20,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.client, self.bucket = client, bucket
        self.source_bucket = source_bucket or bucket
        prefix = prefix.strip("/")
        self.claims = f"{prefix}/.reckon/" if prefix else ".reckon/"
        self.skew, self.max_bytes, self.clock = seconds(skew), max_bytes, clock

    @classmethod
    def connect(
        cls,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        timeout: float = 10.0,
        addressing_style: Literal["auto", "path", "virtual"] = "auto",
        **options: Any,
    ) -> "S3Connector":
        """A connector with its own client: no retries by botocore, ``timeout`` seconds to connect and to read.
        ``options`` go to ``S3Connector`` (prefix, source_bucket, skew, max_bytes, clock)."""
        config = Config(
            retries={"total_max_attempts": 1},
            connect_timeout=timeout,
            read_timeout=timeout,
            s3={"addressing_style": addressing_style},
        )
        client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region_name,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            config=config,
        )
        return cls(client, bucket, **options)

    # -- the contract ---------------------------------------------------------------------------------------------

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        try:
            parsed = WriteRequest.parse(request)
            write = self._write_for(parsed)
            if problem := op_key_problem(op_key):
                raise InvalidRequest(problem)
        except InvalidRequest as exc:
            return Failed("invalid_params", str(exc))
        return self._answered(lambda: self._submit(op_key, parsed, write), query=False)

    def compensate(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        """A compensation (typically ``delete`` of what a ``put`` wrote) under its own op key, as ``submit``."""
        return self.submit(op_key, request)

    def delete(self, op_key: str, locator: str) -> Outcome:
        """Delete exactly the object ``locator`` (a staging object) once per op key; count 1, or 0 if it was gone."""
        return self.submit(op_key, {"action": "delete", "input": {"key": locator}})

    def lookup(self, op_key: str) -> Outcome:
        if op_key_problem(op_key):
            return NotFound()  # a key submit refuses never took effect
        return self._answered(lambda: self._settle(op_key, fence=False), query=True)

    def fence(self, op_key: str) -> Outcome:
        """What became of ``op_key``, final where S3 allows: Committed if it landed; Fenced if no write had claimed it
        (none can from now on); a claimed write not landed answers as ``lookup`` (the module's rule)."""
        if op_key_problem(op_key):
            return Fenced()  # submit refuses such a key: it can never take effect
        return self._answered(lambda: self._settle(op_key, fence=True), query=True)

    def current_version(self, locator: str) -> str:
        """The object's ETag; for a prefix ending in ``/``, ``sha256:<hex>`` over its objects' ``key\\tETag`` lines.
        ``SourceNotFound`` when there is nothing there; ``ConnectionError`` when S3 cannot be asked."""
        try:
            if locator.endswith("/"):
                return self._listing_version(locator)
            return _etag(self._call("head_object", Bucket=self.source_bucket, Key=locator))
        except _S3Error as exc:
            if exc.status == 404:
                raise SourceNotFound(f"s3://{self.source_bucket}/{locator}: no such object") from exc
            raise ConnectionError(f"version of {locator}: {exc}") from exc
        except (_NotSent, _NoAnswer) as exc:
            raise ConnectionError(f"version of {locator}: {exc}") from exc

    def verify_conditional_writes(self) -> None:
        """Write a probe object twice with ``If-None-Match: *`` (then delete it): the second must be refused.
        ``ConditionalWritesUnsupported`` when the bucket ignores the condition."""
        probe = f"{self.claims}probe/{uuid4().hex}"
        try:
            self._call("put_object", Bucket=self.bucket, Key=probe, Body=b"1", IfNoneMatch="*")
            try:
                self._call("put_object", Bucket=self.bucket, Key=probe, Body=b"2", IfNoneMatch="*")
            except _S3Error as exc:
                if exc.status in (409, 412):
                    return
                raise ConditionalWritesUnsupported(f"s3://{self.bucket}: If-None-Match refused as {exc}") from exc
            raise ConditionalWritesUnsupported(f"s3://{self.bucket} ignores If-None-Match: * on PutObject")
        finally:
            with contextlib.suppress(_S3Error, _NotSent, _NoAnswer):  # a probe left behind is harmless
                self._call("delete_object", Bucket=self.bucket, Key=probe)

    # -- one write ------------------------------------------------------------------------------------------------

    def _write_for(self, request: WriteRequest) -> _Write:
        given, action = request.input, request.action
        if action not in ("put", "copy", "delete"):
            raise InvalidRequest(f"the S3 connector has no action {action!r:.80} (put, copy, delete)")
        key = self._target_key(text_field(given, "key"))
        if action == "delete":
            return _Write("delete", key)
        expect = optional_text(given, "replaces", limit=200) or ABSENT
        if action == "put":
            body = given.get("body")
            if not isinstance(body, str):
                raise InvalidRequest("input.body is the object's content, a string")
            content_type = optional_text(given, "content_type", limit=200) or "text/plain; charset=utf-8"
            return _Write("put", key, expect, body=body, content_type=content_type)
        source = text_field(given, "source")
        return _Write("copy", key, expect, source=source, source_version=optional_text(given, "source_version"))

    def _target_key(self, key: str) -> str:
        if len(key.encode()) > 1024:
            raise InvalidRequest("an S3 key is at most 1024 bytes")
        if key.startswith(self.claims) or key.startswith("/"):
            raise InvalidRequest(f"key {key!r:.80} is under the connector's claims ({self.claims}) or starts with /")
        return key

    def _submit(self, op_key: str, request: WriteRequest, write: _Write) -> Outcome:
        if request.late(self.clock()):
            return Failed("dependency_unavailable", _LATE)
        content = self._content(write)
        claim = self._claim(op_key, request, write, content)
        if claim.state == "fenced":
            return Fenced()
        if claim.request != request.digest:
            return Failed("invalid_params", "this op key already claimed another request: nothing written")
        if claim.receipt is not None:
            return claim.receipt
        if request.late(self.clock()):
            return Failed("dependency_unavailable", _LATE)
        claim = self._extend(op_key, claim, request.not_after)
        receipt = self._write(op_key, claim, content)
        if isinstance(receipt, Committed):
            self._record(op_key, claim, receipt)
        return receipt

    def _content(self, write: _Write) -> _Content | None:
        """What a put or copy writes (a copy reads its source, at ``source_version`` when given)."""
        if write.action == "delete":
            return None
        if write.action == "put":
            body, content_type = (write.body or "").encode(), write.content_type
        else:
            params = {"Bucket": self.source_bucket, "Key": write.source}
            if write.source_version:
                params["IfMatch"] = _quoted(write.source_version)
            try:
                answer = self._call("get_object", **params)
            except _S3Error as exc:
                if exc.status == 412:
                    raise _Answer(Failed("conflict", f"{write.source} is not at {write.source_version}")) from exc
                if exc.status == 404:
                    raise _Answer(Failed("invalid_params", f"no source object {write.source}")) from exc
                raise
            if int(answer.get("ContentLength") or 0) > self.max_bytes:
                raise _Answer(Failed("invalid_params", f"{write.source} is larger than {self.max_bytes} bytes"))
            body = self._read_body(answer)
            content_type = str(answer.get("ContentType") or "application/octet-stream")
        if len(body) > self.max_bytes:
            raise _Answer(Failed("invalid_params", f"the object is larger than {self.max_bytes} bytes"))
        return _Content(body, "sha256:" + hashlib.sha256(body).hexdigest(), content_type)

    def _claim(self, op_key: str, request: WriteRequest, write: _Write, content: _Content | None) -> _Claim:
        """The op key's claim: ours if we create it, else the one already there (created by a copy sent before, or
        a fence)."""
        expect = write.expect
        if write.action == "delete":
            expect = self._state_of(write.key)
        claim = _Claim(
            state="claimed",
            action=write.action,
            key=write.key,
            request=request.digest,
            digest=content.digest if content else "",
            expect=expect,
            not_after=request.not_after,
        )
        try:
            answer = self._call(
                "put_object",
                Bucket=self.bucket,
                Key=self._claim_key(op_key),
                Body=claim.document(),
                ContentType="application/json",
                IfNoneMatch="*",
            )
            return replace(claim, etag=_etag(answer))
        except _S3Error as exc:
            if exc.status not in (409, 412):
                raise
        found = self._read_claim(op_key)
        if found is None:  # a concurrent conditional write to the claim (409) that did not land either
            raise _Answer(Failed("dependency_unavailable", "another write to the claim was in progress: not written"))
        return found

    def _extend(self, op_key: str, claim: _Claim, not_after: datetime | None) -> _Claim:
        """A re-send moves the claim's deadline to its own (later) one, so that its write has its own window."""
        if not_after is None or claim.not_after is None or not_after <= claim.not_after:
            return claim
        moved = replace(claim, not_after=not_after)
        try:
            answer = self._call(
                "put_object",
                Bucket=self.bucket,
                Key=self._claim_key(op_key),
                Body=moved.document(),
                ContentType="application/json",
                IfMatch=_quoted(claim.etag),
            )
        except _S3Error:
            return claim  # moved by another copy meanwhile: its deadline stands
        return replace(moved, etag=_etag(answer))

    def _write(self, op_key: str, claim: _Claim, content: _Content | None) -> Outcome:
        if claim.action == "delete" or content is None:
            self._call("delete_object", Bucket=self.bucket, Key=claim.key)
            return self._receipt(claim, etag="")
        condition = {"IfNoneMatch": "*"} if claim.expect == ABSENT else {"IfMatch": _quoted(claim.expect)}
        try:
            answer = self._call(
                "put_object",
                Bucket=self.bucket,
                Key=claim.key,
                Body=content.body,
                ContentType=content.content_type,
                Metadata={OP_KEY_METADATA: op_key, DIGEST_METADATA: content.digest},
                **condition,
            )
        except _S3Error as exc:
            if exc.status not in (404, 409, 412):
                raise
            # Refused by its precondition: an earlier copy of this op key may have landed it.
            landed = self._landed(op_key, claim)
            if landed is not None:
                return landed
            if exc.status == 409:
                return Failed("connection_interrupted", f"a concurrent write to {claim.key}: {exc}")
            return Failed("conflict", f"s3://{self.bucket}/{claim.key} is not {claim.expect}: written by another")
        return self._receipt(replace(claim, digest=content.digest), etag=_etag(answer))

    def _settle(self, op_key: str, *, fence: bool) -> Outcome:
        claim = self._read_claim(op_key)
        if claim is None and fence:
            fenced = _Claim("fenced", "put", "", "", "", ABSENT, None)
            try:
                self._call(
                    "put_object",
                    Bucket=self.bucket,
                    Key=self._claim_key(op_key),
                    Body=fenced.document(),
                    ContentType="application/json",
                    IfNoneMatch="*",
                )
                return Fenced()
            except _S3Error as exc:
                if exc.status not in (409, 412):
                    raise
            claim = self._read_claim(op_key)  # a submit claimed it first
            if claim is None:
                return Failed("connection_interrupted", "the claim was being written concurrently: ask again")
        if claim is None:
            return NotFound()
        if claim.state == "fenced":
            return Fenced()
        if claim.receipt is not None:
            return claim.receipt
        landed = self._landed(op_key, claim)
        if landed is not None:
            self._record(op_key, claim, landed)
            return landed
        if claim.not_after is not None and self.clock() <= claim.not_after + self.skew:
            return NotFound()
        return Unprovable(
            f"{op_key} claimed s3://{self.bucket}/{claim.key} but its write has not landed by its deadline "
            f"({claim.not_after.isoformat() if claim.not_after else 'none given'}): S3 cannot refuse a write still "
            "in flight. Check the object and settle the operation by hand."
        )

    def _landed(self, op_key: str, claim: _Claim) -> Committed | None:
        """The op key's write as the target shows it now, or None when it has not landed."""
        try:
            head = self._call("head_object", Bucket=self.bucket, Key=claim.key)
        except _S3Error as exc:
            if exc.status != 404:
                raise
            return self._receipt(claim, etag="") if claim.action == "delete" else None
        if claim.action == "delete":
            return None
        metadata = {name.lower(): value for name, value in (head.get("Metadata") or {}).items()}
        if metadata.get(OP_KEY_METADATA) != op_key:
            return None
        return self._receipt(replace(claim, digest=str(metadata.get(DIGEST_METADATA) or claim.digest)), _etag(head))

    def _record(self, op_key: str, claim: _Claim, receipt: Committed) -> None:
        """The claim says ``written`` with its receipt (best effort: without it, the object still answers)."""
        written = replace(claim, state="written", receipt=receipt)
        with contextlib.suppress(_S3Error, _NotSent, _NoAnswer):
            self._call(
                "put_object",
                Bucket=self.bucket,
                Key=self._claim_key(op_key),
                Body=written.document(),
                ContentType="application/json",
                IfMatch=_quoted(claim.etag),
            )

    def _receipt(self, claim: _Claim, etag: str) -> Committed:
        remote_id = f"s3://{self.bucket}/{claim.key}"
        if claim.action == "delete":
            return Committed(remote_id=remote_id, count=0 if claim.expect == ABSENT else 1)
        return Committed(remote_id=remote_id, remote_version=etag, count=1, digest=claim.digest)

    # -- S3 calls -------------------------------------------------------------------------------------------------

    def _read_claim(self, op_key: str) -> _Claim | None:
        try:
            answer = self._call("get_object", Bucket=self.bucket, Key=self._claim_key(op_key))
        except _S3Error as exc:
            if exc.status == 404:
                return None
            raise
        raw = self._read_body(answer)
        try:
            return _Claim.read(raw, _etag(answer))
        except (ValueError, KeyError, TypeError, InvalidRequest) as exc:
            detail = f"the claim {self._claim_key(op_key)} is not a Reckon claim: settle the operation by hand"
            raise _Answer(Unprovable(detail)) from exc

    def _state_of(self, key: str) -> str:
        """The target's ETag now, or ABSENT."""
        try:
            return _etag(self._call("head_object", Bucket=self.bucket, Key=key))
        except _S3Error as exc:
            if exc.status == 404:
                return ABSENT
            raise

    def _listing_version(self, prefix: str) -> str:
        hasher, count, token = hashlib.sha256(), 0, None
        while True:
            params = {"Bucket": self.source_bucket, "Prefix": prefix} | ({"ContinuationToken": token} if token else {})
            page = self._call("list_objects_v2", **params)
            for item in page.get("Contents") or []:  # S3 lists keys in UTF-8 binary order
                hasher.update(f"{item['Key']}\t{str(item.get('ETag', '')).strip(chr(34))}\n".encode())
                count += 1
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        if count == 0:
            raise _S3Error(404, "NoSuchKey", f"nothing under {prefix}")
        return "sha256:" + hasher.hexdigest()

    def _claim_key(self, op_key: str) -> str:
        return f"{self.claims}ops/{quote(op_key, safe='')}"

    def _read_body(self, answer: Mapping[str, Any]) -> bytes:
        try:
            return bytes(answer["Body"].read())
        except BotoCoreError as exc:
            raise _NoAnswer(f"reading the body: {exc}") from exc

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], getattr(self.client, operation)(**params))
        except ClientError as exc:
            raise _S3Error.of(exc) from exc
        except ParamValidationError as exc:
            raise _Answer(Failed("invalid_params", f"not sent: {exc}")) from exc
        except (EndpointConnectionError, ConnectTimeoutError) as exc:
            raise _NotSent(str(exc)) from exc
        except BotoCoreError as exc:  # read timeout, connection closed: sent, no answer
            raise _NoAnswer(f"{type(exc).__name__}: {exc}") from exc

    def _answered(self, work: Callable[[], Outcome], *, query: bool) -> Outcome:
        """``work``'s outcome, with S3's refusals classified once. A query (lookup, fence) that fails is still
        unknown: ``connection_interrupted``, ask again."""
        try:
            return work()
        except _Answer as answer:
            return answer.outcome
        except _NotSent as exc:
            return Failed("connection_interrupted" if query else "dependency_unavailable", f"not sent: {exc}")
        except _NoAnswer as exc:
            return Failed("connection_interrupted", f"no answer: {exc}")
        except _S3Error as exc:
            return Failed("connection_interrupted" if query else exc.failure, str(exc))


def _etag(answer: Mapping[str, Any]) -> str:
    return str(answer.get("ETag") or "").strip('"')


def _quoted(etag: str) -> str:
    return f'"{etag.strip(chr(34))}"'


__all__ = ["ABSENT", "ConditionalWritesUnsupported", "S3Connector"]
