"""The base of every named refusal in Reckon. ``code`` is stable: the agent API maps it to problem details
(api/errors.py), the console to a message (console/errors.py). A service raises before it writes, or inside the
transaction it rolls back: a refusal leaves the database exactly as it was.

It lives at the bottom of the layers so that every layer can refuse by name: the record's hygiene here in audit,
the domain's rules in tasks (``tasks.core.errors.TaskError``)."""

from typing import Any


class Refused(Exception):
    code = "refused"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details
