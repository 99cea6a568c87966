"""The reference agent: "migrate a project" into the object store. The example to copy.

It uses only Reckon's public services — ``tasks.engine.plans.task_create`` to register the plan,
``tasks.engine.runner`` (or the
Celery job ``tasks.drive_task``) to run it, the connector contract for everything external — and holds no rule of
its own. The plan: prepare the target, copy the objects in batches, verify every digest against the source
snapshot, switch the project's reference (irreversible; its compensation points it back). The temporary staging
copies each batch leaves are recorded from the receipts and deleted once the task ends (``tasks/engine/cleanup.py``).

Batches are sized by the remote's transaction boundary (``store.max_batch()``, the most objects one copy may span),
never by what a model proposes: ``n`` objects are ``ceil(n / max_batch)`` batches, each its own operation and op key.

    task = start(project="acme", objects=1200, source=source_ref, store=connector, created_by="agent:migrator")
    run_task_once(task_id=task.pk, holder_id="worker-1", connector=connector)     # or drive_task.delay(task.pk)
"""

from typing import Any

from django.conf import settings

from reference.objectstore import ObjectStoreConnector
from tasks.core.inputs import InputField
from tasks.engine.plans import task_create
from tasks.models import Task

KIND = "migrate_project"
# The object store's actions a plan of this kind may name (registered at start-up by reference/apps.py).
STORE_ACTIONS = {
    "store.prepare_target": "create the target bucket/prefix for a project",
    "store.copy_batch": "copy one batch of objects, bounded by the remote's transaction",
    "store.verify_digests": "verify the digests of copied objects",
    "store.switch_reference": "point the project's reference at the new location",
    "store.restore_reference": "point the reference back (compensation of switch)",
    "store.delete_objects": "delete objects by locator (cleanup, irreversible)",
}
_TARGET = InputField("string", "the target's id: prepare-target's remote_id")
_SOURCE = InputField("ref", "the source snapshot, by its versioned ref")
# What each of them takes as a node's input (the store reads exactly these: harness/simulator.py).
STORE_INPUTS: dict[str, dict[str, InputField]] = {
    "store.prepare_target": {
        "project": InputField("string", "the project whose target to create"),
        "source": InputField("ref", "the source the project is migrated from", required=False),
    },
    "store.copy_batch": {
        "target": _TARGET,
        "source": _SOURCE,
        "batch": InputField("integer", "the batch's number, from 1", minimum=1),
        "limit": InputField("integer", "how many objects the batch copies (at most the store's max_batch)", minimum=1),
    },
    "store.verify_digests": {"target": _TARGET, "source": _SOURCE},
    "store.switch_reference": {"target": _TARGET, "source": _SOURCE},
    "store.restore_reference": {
        "target": InputField("string", "the target switched to", required=False),
        "source": _SOURCE,
    },
    "store.delete_objects": {"target": _TARGET, "prefix": InputField("string", "the locators' prefix to delete")},
}


def connector() -> ObjectStoreConnector:
    """The connector a worker drives a task of this kind with: the configured store
    (``RECKON_OBJECTSTORE_URL``), deduping by op key or, with ``RECKON_OBJECTSTORE_IDEMPOTENCY=tag``, by tag; it
    waits ``RECKON_OBJECTSTORE_TIMEOUT_SECONDS`` for an answer."""
    timeout = settings.RECKON_OBJECTSTORE_TIMEOUT
    if settings.RECKON_OBJECTSTORE_IDEMPOTENCY == "tag":
        return ObjectStoreConnector(settings.RECKON_OBJECTSTORE_URL, idempotency="tag", timeout=timeout)
    return ObjectStoreConnector(settings.RECKON_OBJECTSTORE_URL, idempotency="remote", timeout=timeout)


def batches(objects: int, max_batch: int) -> list[int]:
    """Batch sizes covering ``objects``, none larger than the remote's transaction boundary."""
    if objects < 1 or max_batch < 1:
        raise ValueError("a migration copies at least one object, in batches of at least one")
    full, rest = divmod(objects, max_batch)
    return [max_batch] * full + ([rest] if rest else [])


def plan(
    project: str, *, objects: int, source: dict[str, Any], max_batch: int, confirm_switch: bool = False
) -> dict[str, Any]:
    """The plan document. ``source`` is a versioned ref: ``{"source", "locator", "version", "digest"}``.
    ``confirm_switch`` puts a person's approval before the reference switch."""
    target = {"from": "prepare-target", "field": "remote_id"}
    nodes: list[dict[str, Any]] = [
        {
            "key": "prepare-target",
            "action": "store.prepare_target",
            "input": {"project": project, "source": {"ref": source}},
            "evidence": {"remote_id": True},
            "rerun": "idempotent: the target is created once per op key",
        }
    ]
    batches(objects, max_batch)  # refuses a migration of nothing
    nodes.append(  # one node per batch: copy-batch-1 … copy-batch-n (tasks/core/plan.py, fan-out)
        {
            "key": "copy-batch",
            "action": "store.copy_batch",
            "depends_on": ["prepare-target"],
            "fan_out": {"total": objects, "batch": max_batch},
            "input": {
                "target": target,
                "source": {"ref": source},
                "batch": {"each": "index"},
                "limit": {"each": "size"},
            },
            "evidence": {"remote_id": True, "count": {"input": "limit"}},
            "on_failure": {"dependency_unavailable": "retry"},
            "rerun": "idempotent by op key: the store dedupes the batch",
        }
    )
    nodes.append(
        {
            "key": "verify-digests",
            "action": "store.verify_digests",
            "depends_on": ["copy-batch"],
            "input": {"target": target, "source": {"ref": source}},
            "evidence": {"remote_id": True, "count": objects, "digest": {"input": "source", "field": "digest"}},
        }
    )
    before_switch = "verify-digests"
    if confirm_switch:
        nodes.append(
            {
                "key": "approve-switch",
                "action": "approval",
                "depends_on": ["verify-digests"],
                "evidence": {"remote_id": True},
            }
        )
        before_switch = "approve-switch"
    nodes.append(
        {
            "key": "switch-reference",
            "action": "store.switch_reference",
            "depends_on": [before_switch],
            "input": {"target": target, "source": {"ref": source}},
            "evidence": {"remote_id": True, "remote_version": {"input": "source", "field": "version"}},
            "irreversible": True,
            "compensation": "store.restore_reference",
        }
    )
    return {"nodes": nodes}


class SourceMoved(ValueError):
    """The source is no longer at the version the caller asked to migrate: plan against what is true now."""


def start(
    *,
    project: str,
    objects: int,
    source: dict[str, Any],
    store: ObjectStoreConnector,
    created_by: str,
    max_batch: int | None = None,
    confirm_switch: bool = False,
) -> Task:
    """Register the migration of ``objects`` objects of ``source`` (a versioned ref) as a task; a worker (or
    ``tasks.engine.runner.run_task_once``) runs it. The batch size is the store's transaction boundary, or ``max_batch``
    when that is smaller. The source must still be at the ref's version."""
    now = store.current_version(source["locator"])
    if now != source["version"]:
        raise SourceMoved(f"{source['locator']} is at version {now}, not {source['version']}")
    boundary = store.max_batch()
    size = min(max_batch, boundary) if max_batch else boundary
    document = plan(project, objects=objects, source=source, max_batch=size, confirm_switch=confirm_switch)
    return task_create(
        kind=KIND, title=f"Migrate project {project}", plan=document, created_by=created_by, project=project
    )
