"""Reckon's Python client: drive Reckon tasks from an agent over the REST API (docs/api.md), sync or async.

    from reckon_client import Reckon, Committed

    with Reckon("http://127.0.0.1:8000", token) as reckon:
        task = reckon.create_task("migrate_project_api", "Migrate acme", plan, project="acme")
        result = reckon.run(task.id, connector)   # done / stopped (reason) / waiting (until)

The author writes the plan and a connector (``submit`` / ``lookup`` / ``current_version``); leases, directives, op
keys, If-Match and reconciliation are the client's.
"""

from reckon_client.aio import AsyncReckon
from reckon_client.connector import Actions, AsyncConnector, Connector, Deleting, Fencing
from reckon_client.errors import ApiError
from reckon_client.outcomes import (
    Accepted,
    Committed,
    Failed,
    FailureClass,
    Fenced,
    NotFound,
    Outcome,
    Unprovable,
)
from reckon_client.protocol import NodeReceipt, Retained, RetainedRef, RunResult, Task
from reckon_client.sync import Reckon

__all__ = [
    "Accepted",
    "Actions",
    "ApiError",
    "AsyncConnector",
    "AsyncReckon",
    "Committed",
    "Connector",
    "Deleting",
    "Failed",
    "FailureClass",
    "Fenced",
    "Fencing",
    "NodeReceipt",
    "NotFound",
    "Outcome",
    "Reckon",
    "Retained",
    "RetainedRef",
    "RunResult",
    "Task",
    "Unprovable",
]
