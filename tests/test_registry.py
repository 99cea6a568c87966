"""Task kinds and their connectors (tasks/engine/registry.py): the agents app registers its kind at start-up, a worker
looks the connector up by the task's kind, and a kind nobody registered is refused by name."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings

from reference import migrate_project
from reference.objectstore import ObjectStoreConnector
from tasks.core.actions import get_action
from tasks.core.errors import TaskError, UnknownTaskKind
from tasks.core.lifecycle import TaskStatus
from tasks.core.outcomes import Committed, NotFound, Outcome
from tasks.engine.registry import connector_for, known_kinds
from tasks.jobs import drive_task
from tasks.models import Task
from tests.kinds import kind_registered

KIND = "registry_test"


class Instant:
    """A remote that commits every write at once and remembers it by op key."""

    def __init__(self) -> None:
        self.sent: dict[str, dict[str, Any]] = {}

    def submit(self, op_key: str, request: dict[str, Any]) -> Outcome:
        self.sent.setdefault(op_key, request)
        return Committed(remote_id=f"r:{op_key}")

    def lookup(self, op_key: str) -> Outcome:
        return Committed(remote_id=f"r:{op_key}") if op_key in self.sent else NotFound()

    def current_version(self, locator: str) -> str:
        return "1"

    def delete(self, op_key: str, locator: str) -> Outcome:
        return Committed(remote_id=locator, count=0)

    def compensate(self, op_key: str, request: dict[str, Any]) -> Outcome:
        return self.submit(op_key, request)


@pytest.fixture
def instant() -> Iterator[Instant]:
    """A test kind of its own, registered for the test only."""
    remote = Instant()
    with kind_registered(KIND, connector=lambda: remote):
        yield remote


def test_the_agents_app_registers_its_kind_and_its_actions_at_start_up() -> None:
    assert migrate_project.KIND in known_kinds()
    assert all(get_action(name) is not None for name in migrate_project.STORE_ACTIONS)


def test_the_reference_kind_gets_a_fresh_object_store_connector_from_the_settings() -> None:
    with override_settings(RECKON_OBJECTSTORE_URL="http://127.0.0.1:9", RECKON_OBJECTSTORE_IDEMPOTENCY="tag"):
        connector = connector_for("migrate_project")
        assert isinstance(connector, ObjectStoreConnector)
        assert (connector.base_url, connector.idempotency) == ("http://127.0.0.1:9", "tag")
        assert connector_for("migrate_project") is not connector


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(UnknownTaskKind) as refused:
        connector_for("nobody_registered_this")
    assert isinstance(refused.value, TaskError)
    assert (refused.value.code, refused.value.details) == ("unknown_task_kind", {"kind": "nobody_registered_this"})


def test_a_worker_drives_a_task_with_the_connector_of_its_kind(
    instant: Instant, make_task: Callable[..., Task]
) -> None:
    task = make_task(kind=KIND)
    summary = drive_task(task.pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, summary
    assert len(instant.sent) == 2


def test_a_worker_refuses_a_task_of_an_unregistered_kind_and_leaves_it_as_it_was(
    make_task: Callable[..., Task],
) -> None:
    task = make_task(kind="nobody_registered_this")
    with pytest.raises(UnknownTaskKind):
        drive_task(task.pk)
    assert Task.objects.get(pk=task.pk).version == task.version


def test_a_wake_up_for_a_task_that_does_not_exist_does_nothing(db: None) -> None:
    assert drive_task(10**9) == "skipped: task_not_found"
