"""The demo's tasks (``./dev demo``, ``manage.py load_demo``): one per state a person meets in the console, each
driven there the way it happens in production — the reference agent's worker loop
(``tasks.engine.runner.run_task_once``)
against the object-store simulator (harness/simulator.py), with the store's fault injection standing in for the
outage, the dropped connection or the revoked permission, and people acting through the services (cancel). No
status column is written here: what the console shows is what the services decided.

Faults are aimed at one task's op keys (the simulator's ``match``), so each scenario disturbs only its own task,
and they are chosen so the live demo keeps moving after loading: the long copy finishes, the backing-off task
recovers, the cancelled copy settles, while the tasks that wait for a person wait.
"""

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection

from audit.principals import Principal
from reference.demo import SOURCE_DIGEST, migration_plan
from reference.migrate_project import KIND, connector, plan
from reference.objectstore import ObjectStoreConnector
from tasks.engine.plans import task_create
from tasks.engine.runner import run_task_once
from tasks.engine.verification import task_verify_log
from tasks.models import Receipt, Task
from tasks.people.cancel import task_request_cancel

CREATED_BY = "agent:demo"  # every demo task is created by this agent; load_demo loads them once
HOLDER = "agent:demo-loader"  # the worker identity that drives them while loading
SOURCE_VERSION = "7"
FOREVER = 1_000_000  # a fault that lasts the whole demo (faults live in the simulator's memory)


class StoreUnavailable(RuntimeError):
    """The object-store simulator does not answer at the configured URL."""


@dataclass(frozen=True)
class StoreControl:
    """The simulator's control API (``/_faults``, ``/_sources``): fault injection and source versions."""

    url: str

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(  # noqa: S310 - the configured simulator's URL
            self.url + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except (urllib.error.URLError, OSError) as exc:
            raise StoreUnavailable(f"the object store at {self.url} does not answer ({exc})") from exc

    def fault(self, mode: str, *, match: str, times: int = 1, **extra: Any) -> None:
        self.post("/_faults", {"mode": mode, "match": match, "times": times, **extra})

    def source(self, project: str) -> None:
        locator = f"projects/{project}"
        self.post("/_sources", {"locator": locator, "version": SOURCE_VERSION, "digest": SOURCE_DIGEST})

    def wait_until_up(self, seconds: float) -> None:
        """The simulator may still be starting (``./dev demo`` starts it just before)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                with urllib.request.urlopen(self.url + "/limits", timeout=2):  # noqa: S310
                    return
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"the object store at {self.url} does not answer ({exc})") from exc
                time.sleep(0.2)


@dataclass(frozen=True)
class Demo:
    store: StoreControl
    connector: ObjectStoreConnector
    operator: Principal  # cancels (a person allowed to operate the demo tasks)


def _source(project: str) -> dict[str, str]:
    return {"source": "store", "locator": f"projects/{project}", "version": SOURCE_VERSION, "digest": SOURCE_DIGEST}


def _plan(project: str, *, batches: int = 3, approval: bool = False, copy_attempts: int = 3) -> dict[str, Any]:
    """The reference agent's migration (with the demo's approval before cleanup when ``approval``); every copy
    may be tried ``copy_attempts`` times."""
    document = (
        migration_plan(project, batches=batches)
        if approval
        else plan(project, objects=batches * 50, source=_source(project), max_batch=50)
    )
    for node in document["nodes"]:
        if node["action"] == "store.copy_batch":
            node["max_attempts"] = copy_attempts
    return document


def _create(demo: Demo, project: str, title: str, **plan_options: Any) -> Task:
    demo.store.source(project)
    return task_create(
        kind=KIND,
        title=f"Migrate project {project}: {title}",
        plan=_plan(project, **plan_options),
        created_by=CREATED_BY,
        project=project,
    )


def _op_key(task: Task, node_key: str) -> str:
    """The op-key prefix of a node's effect on the task's first plan (tasks/core/opkeys.py's format), any retry."""
    return f"rk-{task.uid.hex}-p1-{node_key}-"


def _drive(demo: Demo, task: Task, max_steps: int = 500) -> Task:
    """One wake-up of a worker, as Celery runs it (tasks.jobs.drive_task)."""
    run_task_once(task_id=task.pk, holder_id=HOLDER, connector=demo.connector, max_steps=max_steps)
    return Task.objects.get(pk=task.pk)


def completed(demo: Demo) -> Task:
    """The whole migration, its staging copies deleted once it ended."""
    return _drive(demo, _create(demo, "alder", "done, staging copies cleaned up"))


def awaiting_approval(demo: Demo) -> Task:
    """Migrated; the irreversible sweep of the staging prefix waits for a person's approval."""
    return _drive(demo, _create(demo, "birch", "waits for approval before an irreversible sweep", approval=True))


def running(demo: Demo) -> Task:
    """A long migration, two steps in; the store answers each further copy slowly, so the worker takes a while."""
    task = _drive(demo, _create(demo, "cedar", "a long copy in progress", batches=8, approval=True), max_steps=2)
    demo.store.fault("latency", match=_op_key(task, "copy-batch"), times=7, ms=2500, action="copy_batch")
    return task


def observing(demo: Demo) -> Task:
    """The store accepted the digest check and runs it for two minutes: the worker observes it by op key."""
    task = _create(demo, "dogwood", "the store is still verifying digests")
    demo.store.fault("run_async", match=_op_key(task, "verify-digests"), ms=120_000)
    return _drive(demo, task)


def backing_off(demo: Demo) -> Task:
    """The store is unavailable for the first copy five times: the node backs off (2, 4, 8, 16, 32 s), then goes on."""
    task = _create(demo, "elm", "the store is unavailable, retrying with backoff", copy_attempts=8)
    demo.store.fault("dependency_unavailable", match=_op_key(task, "copy-batch-1"), times=5)
    return _drive(demo, task)


def unknown_reconciled(demo: Demo) -> Task:
    """The store committed a copy but the connection dropped before its answer: the operation was unknown until
    the worker asked the store by op key, found the receipt, and went on to the end."""
    task = _create(demo, "fir", "a dropped answer, reconciled by op key")
    demo.store.fault("accept_then_drop", match=_op_key(task, "copy-batch-2"))
    return _drive(demo, task)


def unknown_unreachable(demo: Demo) -> Task:
    """As above, but the store cannot be asked either: the operation stays unknown until a person settles it."""
    task = _create(demo, "ginkgo", "an unknown copy the store cannot answer for")
    demo.store.fault("accept_then_drop", match=_op_key(task, "copy-batch-2"))
    demo.store.fault("drop", match=_op_key(task, "copy-batch-2"), times=FOREVER)
    return _drive(demo, task)


def permission_revoked(demo: Demo) -> Task:
    """The store refused the reference switch (403): nothing happened remotely; paused for a person."""
    task = _create(demo, "hazel", "the store revoked the permission to switch the reference")
    demo.store.fault("permission_revoked", match=_op_key(task, "switch-reference"), action="switch_reference")
    return _drive(demo, task)


def budget_exhausted(demo: Demo) -> Task:
    """The only attempt of a copy met an outage: its budget is spent, the task pauses and a person takes over
    with the takeover package (tasks.reads.takeover.takeover_package)."""
    task = _create(demo, "juniper", "a copy's attempt budget is spent", copy_attempts=1)
    demo.store.fault("dependency_unavailable", match=_op_key(task, "copy-batch-1"))
    return _drive(demo, task)


def stopping(demo: Demo) -> Task:
    """Cancelled while the store runs a copy (accepted, ninety seconds): stopping until that copy settles."""
    task = _create(demo, "larch", "cancelled while a copy runs at the store")
    demo.store.fault("run_async", match=_op_key(task, "copy-batch-1"), ms=90_000)
    _drive(demo, task)
    return task_request_cancel(actor=demo.operator, task_id=task.pk, reason="demo: the project owner withdrew it")


def stopped_pending(demo: Demo) -> Task:
    """Cancelled with a copy whose outcome nobody knows (the store cannot be asked): stopped, one operation to
    reconcile by hand."""
    task = _create(demo, "maple", "cancelled with an unknown copy to reconcile")
    demo.store.fault("accept_then_drop", match=_op_key(task, "copy-batch-1"))
    demo.store.fault("drop", match=_op_key(task, "copy-batch-1"), times=FOREVER)
    _drive(demo, task)
    return task_request_cancel(actor=demo.operator, task_id=task.pk, reason="demo: the migration window closed")


def quarantined(demo: Demo) -> Task:
    """Someone edited a stored receipt behind Reckon's back (raw SQL, as a tamperer would; receipts refuse
    changes through the ORM). verify_log finds that the receipt differs from the one the log recorded and
    quarantines the task."""
    task = _drive(demo, _create(demo, "nutmeg", "a receipt was altered outside Reckon"))
    effect = {"operation__task": task, "operation__node__key": "copy-batch-1", "operation__purpose": "effect"}
    receipt = Receipt.objects.get(**effect)
    table = connection.ops.quote_name(Receipt._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET count = %s WHERE id = %s", [(receipt.count or 0) + 1, receipt.pk])  # noqa: S608
    task_verify_log(task_id=task.pk)
    return Task.objects.get(pk=task.pk)


SCENARIOS: list[Callable[[Demo], Task]] = [
    completed,
    awaiting_approval,
    running,
    observing,
    backing_off,
    unknown_reconciled,
    unknown_unreachable,
    permission_revoked,
    budget_exhausted,
    stopping,
    stopped_pending,
    quarantined,
]


def demo_tasks_loaded() -> int:
    return Task.objects.filter(created_by=CREATED_BY).count()


def demo_tasks_load(*, operator: Principal, store_url: str = "", wait_seconds: float = 15) -> list[Task]:
    """Create the demo tasks and drive each into its state. ``store_url``: the simulator (default: the configured
    object store, RECKON_OBJECTSTORE_URL)."""
    store_connector = ObjectStoreConnector(store_url) if store_url else connector()
    store = StoreControl(store_connector.base_url)
    store.wait_until_up(wait_seconds)
    demo = Demo(store=store, connector=store_connector, operator=operator)
    return [scenario(demo) for scenario in SCENARIOS]


def quickstart_source_register(*, project: str, store_url: str = "", wait_seconds: float = 15) -> None:
    """Register ``projects/<project>`` in the simulator at SOURCE_VERSION (again on every load: harmless), for the
    README's agent quick start to migrate."""
    store = StoreControl(ObjectStoreConnector(store_url).base_url if store_url else connector().base_url)
    store.wait_until_up(wait_seconds)
    store.source(project)
