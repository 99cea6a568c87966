"""A service's named refusal, as the console tells it to a person: mapped here once, for every view."""

from tasks.errors import TaskError


def message_for(error: TaskError) -> str:
    """The sentence a person reads when a service refused their action."""
    return str(error)
