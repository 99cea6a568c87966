"""A small demo plan: migrate a project's objects to a new store (the reference task kind)."""

from typing import Any


def migration_plan(project: str = "acme", batches: int = 3, batch_size: int = 50) -> dict[str, Any]:
    source = {"source": "store", "locator": f"projects/{project}", "version": "7", "digest": "sha256:" + "ab" * 32}
    nodes: list[dict[str, Any]] = [
        {
            "key": "prepare-target",
            "action": "store.prepare_target",
            "input": {"project": project, "source": {"ref": source}},
            "evidence": {"remote_id": True},
            "rerun": "idempotent: the target is created once per op key",
        }
    ]
    for n in range(1, batches + 1):
        nodes.append(
            {
                "key": f"copy-batch-{n}",
                "action": "store.copy_batch",
                "depends_on": ["prepare-target"],
                "input": {
                    "target": {"from": "prepare-target", "field": "remote_id"},
                    "source": {"ref": source},
                    "batch": n,
                    "limit": batch_size,
                },
                "evidence": {"remote_id": True, "count": batch_size},
                "on_failure": {"dependency_unavailable": "retry"},
                "rerun": "idempotent by op key: the store dedupes the batch",
            }
        )
    copies = [f"copy-batch-{n}" for n in range(1, batches + 1)]
    nodes += [
        {
            "key": "verify-digests",
            "action": "store.verify_digests",
            "depends_on": copies,
            "input": {"target": {"from": "prepare-target", "field": "remote_id"}, "source": {"ref": source}},
            "evidence": {
                "remote_id": True,
                "count": batches * batch_size,
                "digest": {"input": "source", "field": "digest"},
            },
        },
        {
            "key": "switch-reference",
            "action": "store.switch_reference",
            "depends_on": ["verify-digests"],
            "input": {"target": {"from": "prepare-target", "field": "remote_id"}, "source": {"ref": source}},
            "evidence": {"remote_id": True, "remote_version": {"input": "source", "field": "version"}},
            "irreversible": True,
            "compensation": "store.restore_reference",
        },
        {"key": "approve-cleanup", "action": "approval", "depends_on": ["switch-reference"]},
        {
            "key": "delete-temp-copies",
            "action": "store.delete_objects",
            "depends_on": ["approve-cleanup"],
            "input": {"target": {"from": "prepare-target", "field": "remote_id"}, "prefix": "tmp/"},
            "evidence": {"remote_id": True},
            "irreversible": True,
        },
    ]
    return {"nodes": nodes}
