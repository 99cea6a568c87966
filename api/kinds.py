"""/api/v1/kinds/{kind}/actions: what a plan of a task kind may name, each action with the JSON Schema of a node's
input for it — the contract an agent writes its plans against. The kind is checked against the token's scope before
the handler runs (api/auth.py): outside it, the same 404 as a kind no task can be of."""

from django.http import HttpRequest
from ninja import Router

from api.http import documented
from api.schemas import ActionOut, KindActionsOut
from tasks.core.actions import action_specs

router = Router(tags=["kinds"])


@router.get(
    "/kinds/{kind}/actions",
    response={200: KindActionsOut},
    summary="The actions a plan of this task kind may name, with their inputs",
    openapi_extra=documented(),
)
def kind_actions(request: HttpRequest, kind: str) -> KindActionsOut:
    """Every action a node of a task of ``kind`` may name: its name, whether it is an ``effect`` (one bounded
    external write) or an ``approval`` (a person's confirmation), what it does, and ``input_schema``: the JSON Schema
    of the node's ``input`` — each field a literal, a versioned ``{"ref": …}`` or an earlier node's output
    ``{"from": node, "field": …}``. A plan is checked against it when it is created or proposed (422 plan_invalid
    naming the node and the field). A task kind needs no registration: the actions are the server's. 404
    kind_not_found for a kind outside the token's scope, exactly as for one no task can be of."""
    return KindActionsOut(
        kind=kind,
        actions=[
            ActionOut(name=a.name, kind=a.kind, description=a.description, input_schema=a.input_schema())
            for a in action_specs()
        ],
    )
