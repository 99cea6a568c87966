"""The demo task (``./dev demo``): the reference agent's migration, then a person's confirmation before an extra,
irreversible sweep of the staging prefix — so the demo shows a confirmation point."""

from typing import Any

from reference.migrate_project import plan

SOURCE_DIGEST = "sha256:" + "ab" * 32


def migration_plan(project: str = "acme", batches: int = 3, batch_size: int = 50) -> dict[str, Any]:
    source = {"source": "store", "locator": f"projects/{project}", "version": "7", "digest": SOURCE_DIGEST}
    document = plan(project, objects=batches * batch_size, source=source, max_batch=batch_size)
    document["nodes"] += [
        {
            "key": "approve-cleanup",
            "action": "approval",
            "depends_on": ["switch-reference"],
            "evidence": {"remote_id": True},
        },
        {
            "key": "delete-temp-copies",
            "action": "store.delete_objects",
            "depends_on": ["approve-cleanup"],
            "input": {"target": {"from": "prepare-target", "field": "remote_id"}, "prefix": "tmp/"},
            "evidence": {"remote_id": True},
            "irreversible": True,
        },
    ]
    return document
