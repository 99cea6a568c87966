"""Op keys: made here and nowhere else. Stable for one intent (a re-send uses the same key); a new key only after
a definite rejection. The key is the remote's idempotency key, so its format is part of what the remote sees."""

from uuid import UUID


def effect(task_uid: UUID, plan_version: int, node_key: str, retry: int) -> str:
    """A node's side effect; ``retry`` is the number of definite rejections before it."""
    return f"rk-{task_uid.hex}-p{plan_version}-{node_key}-{retry}"


def by_person(task_uid: UUID, plan_version: int, node_key: str, n: int) -> str:
    """What a person did by hand for a node during a takeover (recorded, never sent)."""
    return f"rk-{task_uid.hex}-p{plan_version}-{node_key}-person-{n}"


def compensation(effect_key: str) -> str:
    return f"{effect_key}-compensation"


def cleanup(task_uid: UUID, temp_resource_id: int, tries: int) -> str:
    return f"rk-{task_uid.hex}-cleanup-{temp_resource_id}-{tries}"
