"""The reference agent over HTTP: migrate a project into the object store (harness/simulator.py speaks its API).

    python examples/migrate_agent.py --url http://127.0.0.1:8000 --token rk_… \\
        --store http://127.0.0.1:8100 --project acme --objects 1200

It plans (prepare the target, copy in batches sized by the store's transaction boundary, verify every digest,
switch the project's reference) and runs the plan with reckon_client; leases, directives, op keys and
reconciliation are the client's. Each copy leaves a staging object its receipt names; once the task has ended,
Reckon tells the agent to delete each one (``delete``), so a finished migration leaves nothing in ``tmp/``.
Killed anywhere and started again with the same arguments, it finds its task again (the create is keyed by project
and source version) and finishes it without writing anything twice: the client reconciles by op key before it sends
anything new.

Its PostgreSQL kind migrates a table from one database to another with the client's PostgreSQL connector
(``reckon-client[postgres]``): batches of key ranges, each copied with its op key in the target's ledger in the same
transaction, then a view switched to the copy (docs/integrations.md):

    python examples/migrate_agent.py --url … --token rk_… --postgres-source postgresql://…/old \
        --postgres-target postgresql://…/new --table public.items --key id --view public.items_current --batch 500
"""

import argparse
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
from reckon_client import (
    Accepted,
    ApiError,
    Committed,
    Failed,
    FailureClass,
    Fenced,
    NotFound,
    Outcome,
    Reckon,
    Task,
    Unprovable,
)

KIND = "migrate_project_api"
TABLE_KIND = "migrate_table_api"  # the PostgreSQL kind (its actions: reference/migrate_table.py on the server)

# A write's HTTP refusal → its failure class (as reference/objectstore.py). Anything else is unknown.
REFUSALS: dict[int, FailureClass] = {
    400: "invalid_params",
    422: "invalid_params",
    401: "permission_revoked",
    403: "permission_revoked",
    409: "conflict",
    429: "dependency_unavailable",
    503: "dependency_unavailable",
}


class SourceNotFound(LookupError):
    """The project to migrate is not in the store (a typo, or a source never registered)."""


class ObjectStore:
    """The connector: the store dedupes writes by op key and answers what became of one (``GET /ops/<op_key>``)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)

    def submit(self, op_key: str, request: Mapping[str, Any]) -> Outcome:
        action = str(request.get("action", "")).removeprefix("store.")
        body = {"action": action, "params": request.get("input", {})}
        # The deadline Reckon gave the request: the store refuses it if it arrives later (a final not found).
        headers = {"Reckon-Not-After": str(request["not_after"])} if request.get("not_after") else {}
        try:
            response = self.http.post(f"/ops/{quote(op_key, safe='')}", json=body, headers=headers)
        except httpx.ConnectError as exc:  # never left: nothing can have happened
            return Failed("dependency_unavailable", f"not sent: {exc}")
        except httpx.TransportError as exc:  # sent, no answer: unknown until looked up
            return Failed("connection_interrupted", str(exc))
        if response.status_code == 200:
            return _outcome(response.json())
        if response.status_code == 409 and _error(response) == "fenced":
            return Fenced()  # the op key is refused for ever: it never takes effect
        if response.status_code == 409 and _error(response) == "deadline_passed":
            # It took no effect; a store whose clock runs ahead by more than the deadline refuses every copy, so
            # each one is a retry on the budget, not a free re-send.
            return Failed("dependency_unavailable", f"HTTP 409 deadline_passed: {response.text[:200]}")
        failure = REFUSALS.get(response.status_code)
        if failure is None:
            failure = "invalid_params" if response.status_code < 500 else "connection_interrupted"
        return Failed(failure, f"HTTP {response.status_code}: {response.text[:200]}")

    def delete(self, op_key: str, locator: str) -> Outcome:
        """Delete exactly the staging object ``locator`` (a temp resource a copy's receipt named) under ``op_key``:
        Reckon asks for it once the task has ended; the store dedupes the delete by op key like any write."""
        return self.submit(op_key, {"action": "delete", "input": {"locator": locator}})

    def lookup(self, op_key: str) -> Outcome:
        try:
            response = self.http.get(f"/ops/{quote(op_key, safe='')}")
        except httpx.TransportError as exc:
            return Failed("connection_interrupted", f"lookup failed: {exc}")
        if response.status_code == 200:
            return _outcome(response.json())
        if response.status_code == 404:
            return NotFound()
        if response.status_code == 501:
            return Unprovable("the object store cannot be queried by op key")
        return Failed("connection_interrupted", f"lookup failed: HTTP {response.status_code}")

    def fence(self, op_key: str) -> Outcome:
        """What became of op_key, and if nothing, the store refuses it from now on (asked once a cancel is
        recorded: a final answer, where a lookup's not found would wait for the request's deadline)."""
        try:
            response = self.http.post(f"/fence/{quote(op_key, safe='')}")
        except httpx.TransportError as exc:
            return Failed("connection_interrupted", f"fence failed: {exc}")
        if response.status_code == 200 and response.json().get("state") == "fenced":
            return Fenced()
        if response.status_code == 200:
            return _outcome(response.json())
        if response.status_code == 501:
            return self.lookup(op_key)
        return Failed("connection_interrupted", f"fence failed: HTTP {response.status_code}")

    def current_version(self, locator: str) -> str:
        return str(self.source(locator)["version"])

    def source(self, locator: str) -> dict[str, Any]:
        """The source's version and digest now. ConnectionError (an OSError) when the store cannot be asked: the
        client then ends the run to try again later, having written nothing."""
        try:
            response = self.http.get(f"/versions/{quote(locator, safe='')}")
        except httpx.TransportError as exc:
            raise ConnectionError(f"version of {locator}: {exc}") from exc
        if response.status_code >= 500:
            raise ConnectionError(f"version of {locator}: HTTP {response.status_code}")
        if response.status_code == 404:
            raise SourceNotFound(f"the store has no source {locator!r}: nothing to migrate")
        response.raise_for_status()
        return dict(response.json())

    def max_batch(self) -> int:
        return int(self.http.get("/limits").raise_for_status().json()["max_batch"])


def _error(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def _outcome(answer: Mapping[str, Any]) -> Outcome:
    receipt = answer.get("receipt") or {}
    if answer.get("state") == "accepted":
        return Accepted(remote_id=str(receipt.get("remote_id", "")))
    if answer.get("state") != "committed":
        return Failed("connection_interrupted", f"unexpected answer {answer.get('state')!r}")
    count, temp = receipt.get("count"), receipt.get("temp")
    return Committed(
        remote_id=str(receipt.get("remote_id", "")),
        remote_version=str(receipt.get("remote_version") or ""),
        count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        digest=str(receipt.get("digest") or ""),
        data={"temp": [str(t) for t in temp]} if isinstance(temp, list) and temp else {},
    )


def plan(project: str, objects: int, source: Mapping[str, Any], max_batch: int) -> dict[str, Any]:
    """Prepare, copy in batches of at most ``max_batch`` (the store's transaction boundary), verify, switch. The
    copies are one fan-out node: Reckon makes it ``copy-batch-1`` … ``copy-batch-n``, each with its batch's number
    and size, so the plan stays a few hundred bytes at a million objects (up to 20,000 nodes in one task)."""
    ref, target = {"ref": dict(source)}, {"from": "prepare-target", "field": "remote_id"}
    nodes: list[dict[str, Any]] = [
        {
            "key": "prepare-target",
            "action": "store.prepare_target",
            "input": {"project": project, "source": ref},
            "evidence": {"remote_id": True},
        },
        {
            "key": "copy-batch",
            "action": "store.copy_batch",
            "depends_on": ["prepare-target"],
            "fan_out": {"total": objects, "batch": max_batch},
            "input": {"target": target, "source": ref, "batch": {"each": "index"}, "limit": {"each": "size"}},
            "evidence": {"remote_id": True, "count": {"input": "limit"}},
            "on_failure": {"dependency_unavailable": "retry"},
        },
        {
            "key": "verify-digests",
            "action": "store.verify_digests",
            "depends_on": ["copy-batch"],
            "input": {"target": target, "source": ref},
            "evidence": {"remote_id": True, "count": objects, "digest": {"input": "source", "field": "digest"}},
        },
    ]
    nodes.append(
        {
            "key": "switch-reference",
            "action": "store.switch_reference",
            "depends_on": ["verify-digests"],
            "input": {"target": target, "source": ref},
            "evidence": {"remote_id": True, "remote_version": {"input": "source", "field": "version"}},
            "irreversible": True,
            "compensation": "store.restore_reference",
        }
    )
    return {"nodes": nodes}


class BatchTooLarge(ValueError):
    """A batch the store's transaction boundary cannot hold."""


def create(reckon: Reckon, store: ObjectStore, project: str, objects: int, batch: int | None = None) -> Task:
    """The task for this migration. The version migrated is the source's now, pinned in the plan; the create is
    keyed by it, so an agent started again with the same arguments gets the same task back and resumes it.
    ``batch``: objects per copy, at most the store's transaction boundary (the default)."""
    locator = f"projects/{project}"
    found = store.source(locator)
    source = {"source": "store", "locator": locator, "version": found["version"], "digest": found["digest"]}
    most = store.max_batch()
    if batch is not None and not 1 <= batch <= most:
        raise BatchTooLarge(f"--batch {batch}: the store copies 1 to {most} objects in one transaction")
    size = batch or most
    document = plan(project, objects, source, size)
    key = f"migrate:{project}:{source['version']}:{objects}:{size}"
    return reckon.create_task(KIND, f"Migrate project {project}", document, project=project, idempotency_key=key)


def table_plan(
    table: str, target: str, key: str, bounds: tuple[int, int], batch: int, view: str, version: str
) -> dict[str, Any]:
    """Copy ``table`` into ``target`` in key ranges of ``batch`` (each pinned to the source's ``version``: a source
    changed under the migration refuses the copy as a conflict), then switch ``view`` to ``target`` (irreversible;
    its compensation puts the view back)."""
    lo, hi = bounds
    copy = {"source": table, "target": target, "key": key, "source_version": version}
    copies = [
        {
            "key": f"copy-{n}",
            "action": "pg.copy_batch",
            "input": copy | {"range": [start, min(start + batch - 1, hi)]},
            "evidence": {"remote_id": True},
            "on_failure": {"dependency_unavailable": "retry"},
        }
        for n, start in enumerate(range(lo, hi + 1, batch), start=1)
    ]
    switch = {
        "key": "switch-view",
        "action": "pg.switch",
        "depends_on": [node["key"] for node in copies],
        "input": {"view": view, "table": target},
        "evidence": {"remote_id": True},
        "irreversible": True,
        "compensation": "pg.switch_back",
    }
    return {"nodes": [*copies, switch]}


def run_table(args: argparse.Namespace) -> int:
    """The PostgreSQL kind: the plan from the source's keys and version, run with the PostgreSQL connector."""
    from reckon_client.connectors.postgres import PostgresConnector  # the client's extra: reckon-client[postgres]

    pg = PostgresConnector(source=args.postgres_source, target=args.postgres_target, prefix="pg.")
    target = args.target_table or args.table
    with Reckon(args.url, args.token) as reckon:
        try:
            bounds = pg.key_bounds(args.table, args.key)
            if bounds is None:
                print(f"{args.table} has no rows: nothing to migrate", file=sys.stderr)
                return 2
            version = pg.current_version(args.table)
            document = table_plan(args.table, target, args.key, bounds, args.batch or 500, args.view, version)
            title = f"Migrate table {args.table}"
            key = f"migrate-table:{args.table}:{target}:{version}:{args.batch or 500}"
            task_id = (
                args.task
                or reckon.create_task(TABLE_KIND, title, document, project=args.table, idempotency_key=key[:200]).id
            )
        except ApiError as refused:
            print(f"Reckon refused the task: {refused}", file=sys.stderr)
            return 2
        except (LookupError, ValueError, ConnectionError) as wrong:
            print(wrong, file=sys.stderr)
            return 2
        print(f"task {task_id}", flush=True)
        while (result := reckon.run(task_id, pg, ttl_seconds=args.lease_ttl, lease_wait=args.lease_wait)).until:
            print(f"waiting ({result.reason}) until {result.until:%H:%M:%S}", flush=True)
            time.sleep(max(0.0, (result.until - datetime.now(UTC)).total_seconds()))
    print(f"task {task_id}: {result.status} {result.reason}".rstrip(), flush=True)
    return 0 if result.done else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Migrate a project into the object store, driven by Reckon.")
    parser.add_argument("--url", required=True, help="Reckon, e.g. http://127.0.0.1:8000")
    parser.add_argument("--token", required=True, help="an agent token (console: Agent tokens)")
    parser.add_argument("--store", help="the object store, e.g. http://127.0.0.1:8100")
    parser.add_argument("--project")
    parser.add_argument("--objects", type=int)
    table = parser.add_argument_group("the PostgreSQL kind (instead of --store, --project and --objects)")
    table.add_argument("--postgres-source", help="the source database (a libpq connection string)")
    table.add_argument("--postgres-target", help="the target database")
    table.add_argument("--table", help="the source table, name or schema.name")
    table.add_argument("--target-table", help="the target table (default: the source's name)")
    table.add_argument("--key", default="id", help="its integer key column (default id)")
    table.add_argument("--view", help="the view switched to the copy at the end")
    parser.add_argument("--batch", type=int, default=None, help="objects per copy (default: the store's most)")
    parser.add_argument("--task", type=int, default=None, help="resume this task instead of creating one")
    parser.add_argument("--lease-ttl", type=int, default=None, help="seconds (default: the server's)")
    parser.add_argument("--lease-wait", type=float, default=60, help="seconds to wait for a crashed run's lease")
    args = parser.parse_args(argv)
    if args.postgres_source:
        if not (args.postgres_target and args.table and args.view):
            parser.error("the PostgreSQL kind needs --postgres-target, --table and --view")
        return run_table(args)
    if not (args.store and args.project and args.objects is not None):
        parser.error("--store, --project and --objects (or the PostgreSQL kind's arguments)")

    store = ObjectStore(args.store)
    with Reckon(args.url, args.token) as reckon:
        try:
            task_id = args.task or create(reckon, store, args.project, args.objects, args.batch).id
        except (SourceNotFound, BatchTooLarge) as wrong:
            print(wrong, file=sys.stderr)
            return 2
        except ApiError as refused:  # nothing was created: say what Reckon said, and what to change
            print(f"Reckon refused the task: {refused}", file=sys.stderr)
            for error in refused.problem.get("errors") or []:
                print(f"  {error.get('field')}: {error.get('message')}", file=sys.stderr)
            return 2
        print(f"task {task_id}", flush=True)
        try:
            while (result := reckon.run(task_id, store, ttl_seconds=args.lease_ttl, lease_wait=args.lease_wait)).until:
                print(f"waiting ({result.reason}) until {result.until:%H:%M:%S}", flush=True)
                time.sleep(max(0.0, (result.until - datetime.now(UTC)).total_seconds()))
        except ApiError as refused:  # the task is as Reckon holds it: run the agent again with --task to resume
            print(f"task {task_id}: Reckon refused a step: {refused}", file=sys.stderr)
            return 1
    print(f"task {task_id}: {result.status} {result.reason}".rstrip(), flush=True)
    return 0 if result.done else 1


if __name__ == "__main__":
    sys.exit(main())
