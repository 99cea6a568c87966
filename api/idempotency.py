"""``Idempotency-Key`` on every POST of the agent API: a retried request (the answer was lost, the agent
restarted) gets the first answer again instead of a second task, a second proposal, a second subscription.

The change and its record are one transaction: a refused request raises inside it, so it stores nothing and may be
retried with the same key; a crash before the commit loses both. Two requests with the same key at once: the second
one's insert of the record conflicts with the first's (the unique constraint), its own change is rolled back with
it, and it answers the first one's response.

**A record is bound to the token that made it** (not only to its agent): a key is looked up for the request's token
alone, so an answer — a lease id, an op key, a webhook's secret — is replayed to that token and to no other. The
same key sent with another token, even one of the same agent, is a key that token has not used: its request runs
as a new one (checked like any other, its scope first: api/auth.py) and gets its own record.

**A compare-and-set looks its key up only when refused** (``guarded``): a write conditional on the version its
request names (``If-Match``) cannot commit twice — once it has, that version has moved and the same request is
refused — so the key's record is looked up when the request is refused, or when its record cannot be inserted
(the same key committed meanwhile), not before every write: a step is one statement fewer. Such a write may also
carry its record in its own statement (``joined``: tasks.engine.cas.compare_and_set's ``also``) instead of a
transaction around the two: one round trip instead of six, the same all-or-nothing."""

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

from api.auth import token_of
from api.errors import problem
from api.models import ApiToken, IdempotencyRecord
from leases import clock
from tasks.core.parsing import ascii_token

HEADER = "Idempotency-Key"
KEY_MAX = 200
# A key is remembered this long; after that the same key is a new request (and its old record is replaced).
KEPT_FOR = timedelta(hours=24)
# Headers of the first answer that a replay repeats.
REPLAYED_HEADERS = ("ETag", "Location")

# The record of an answer as a row (model, fields), for a write that inserts it in its own statement.
type Keep = Callable[[HttpResponse], tuple[type[Model], dict[str, Any]]]


def idempotent(
    request: HttpRequest,
    agent_id: str,
    run: Callable[[], HttpResponse],
    *,
    atomic: bool = True,
    guarded: bool = False,
    joined: Callable[[Keep], HttpResponse | None] | None = None,
) -> HttpResponse:
    """``run()`` once per (token, key): its successful answer is recorded and replayed for the same request made
    with the same token. ``agent_id`` is the request's token's agent (a handler's statement of whose key it is,
    checked); the record is bound to the token itself.

    ``atomic=False`` is for a change that does I/O and commits on its own (``retention.services.retain`` writes its
    file outside any transaction): its record is written just after it. A crash between the two, or a concurrent
    request with the same key, can then leave one extra change that no answer names — for a retained object, a
    version nobody references, which expires — while every answer to the key is still the first one.

    ``guarded=True`` is for a compare-and-set on the request's ``If-Match`` (the module's docstring): the record is
    looked up only once the request is refused or its record conflicts. ``joined`` (guarded only): the write made
    with its record in its own statement — called with ``keep``, which gives the record's row for an answer; it
    answers, or answers None having written nothing, and then ``run`` is used."""
    key = request.headers.get(HEADER)
    if key is None:
        return run()
    token = token_of(request)
    if token.agent_id != agent_id:  # a handler naming another agent's keys: a programming error, never a replay
        raise RuntimeError(f"an Idempotency-Key of agent {agent_id!r} looked up with a token of {token.agent_id!r}")
    if ascii_token(key, max_length=KEY_MAX) is None:
        return problem(
            request,
            code="validation_error",
            detail=f"An {HEADER} is 1 to {KEY_MAX} printable ASCII characters.",
            errors=[{"field": f"header.{HEADER}", "code": "invalid", "message": "1 to 200 printable ASCII characters"}],
        )
    fingerprint = _fingerprint(request)
    if not guarded:
        replay = _replay(request, token, key, fingerprint)
        if replay is not None:
            return replay
    elif joined is not None:

        def keep(response: HttpResponse) -> tuple[type[Model], dict[str, Any]]:
            return IdempotencyRecord, _record_fields(token, key, fingerprint, response)

        answered = _attempts(request, token, key, fingerprint, lambda: joined(keep), guarded=True)
        if answered is not None:
            return answered
    answer = _attempts(
        request, token, key, fingerprint, lambda: _run_and_record(run, token, key, fingerprint, atomic=atomic), guarded
    )
    if answer is None:  # pragma: no cover - _run_and_record always answers
        raise AssertionError("a request ran without an answer")
    return answer


def _attempts(
    request: HttpRequest,
    token: ApiToken,
    key: str,
    fingerprint: str,
    write: Callable[[], HttpResponse | None],
    guarded: bool,
) -> HttpResponse | None:
    """``write()`` (the change and its record), or the first answer to this request under this key."""
    for attempt in range(2):
        try:
            return write()
        except IntegrityError:
            # The same key committed meanwhile by a concurrent request: this one's change is rolled back (atomic).
            replay = _replay(request, token, key, fingerprint)
            if replay is not None:
                return replay
            if not guarded or attempt:
                raise
            # Not looked up before (guarded): an expired record of the key was in the way, and is gone now.
        except Exception:
            # Refused: the first answer, if this very request was made and committed before under this key.
            replay = _replay(request, token, key, fingerprint) if guarded else None
            if replay is None:
                raise
            return replay
    raise AssertionError("unreachable: the second attempt answers or raises")  # pragma: no cover


def _run_and_record(
    run: Callable[[], HttpResponse], token: ApiToken, key: str, fingerprint: str, *, atomic: bool
) -> HttpResponse:
    if atomic:
        with transaction.atomic():
            response = run()
            _record(token, key, fingerprint, response)
    else:
        response = run()
        with transaction.atomic():
            _record(token, key, fingerprint, response)
    return response


def _record(token: ApiToken, key: str, fingerprint: str, response: HttpResponse) -> None:
    if 200 <= response.status_code < 300:
        IdempotencyRecord.objects.create(**_record_fields(token, key, fingerprint, response))


def _record_fields(token: ApiToken, key: str, fingerprint: str, response: HttpResponse) -> dict[str, Any]:
    return {
        "token_id": token.pk,
        "agent_id": token.agent_id,
        "key": key,
        "fingerprint": fingerprint,
        "status": response.status_code,
        "body": response.content.decode(),
        "headers": {name: response[name] for name in REPLAYED_HEADERS if response.has_header(name)},
        "created_at": clock.write_time(),  # the time of the write it records, without another round trip
    }


def _fingerprint(request: HttpRequest) -> str:
    digest = hashlib.sha256()
    for part in (request.method or "", request.path):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(request.body)
    return digest.hexdigest()


def _replay(request: HttpRequest, token: ApiToken, key: str, fingerprint: str) -> HttpResponse | None:
    record = IdempotencyRecord.objects.filter(token=token, key=key).first()
    if record is None:
        return None
    if record.created_at <= clock.now() - KEPT_FOR:
        IdempotencyRecord.objects.filter(pk=record.pk).delete()
        return None
    if record.fingerprint != fingerprint:
        return problem(
            request,
            code="idempotency_key_reused",
            detail=f"This {HEADER} was used for another request (method, path or body differ): use a new key.",
        )
    response = HttpResponse(record.body, status=record.status, content_type="application/json")
    for name, value in record.headers.items():
        response[name] = value
    response["Idempotent-Replayed"] = "true"
    return response


def idempotency_records_expire() -> int:
    """Delete the records older than KEPT_FOR (the retention sweep); returns how many."""
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lte=clock.now() - KEPT_FOR).delete()
    return deleted
