"""Framework integrations as an app: at start-up it registers ``tool.call``, the action a plan names for one
side-effecting tool call of an agent framework (client/reckon_client/tools.py makes such plans). The domain never
imports it."""

from django.apps import AppConfig


class IntegrationsConfig(AppConfig):
    name = "integrations"
    verbose_name = "Reckon framework integrations"

    def ready(self) -> None:
        from tasks.core.actions import register_action
        from tasks.core.inputs import InputField

        register_action(
            "tool.call",
            description="one call of an agent framework's side-effecting tool, under the op key as its idempotency key",
            inputs={
                "tool": InputField("string", "the tool's name"),
                "call_id": InputField("string", "the framework's id of this call (a LangGraph ToolCall's id)"),
                # Wrapped: an argument named ref, from or each at the top would read as a plan reference.
                "arguments": InputField("object", 'the call\'s arguments as {"kwargs": {...}}, exactly as sent'),
            },
        )
