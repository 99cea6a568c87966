"""Who acts. Every service that changes state takes a Principal and checks what it may do."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Principal:
    kind: str  # "user" | "agent" | "system"
    id: str
    user: Any = None  # the django.contrib.auth user, for kind "user"

    @classmethod
    def of_user(cls, user: Any) -> "Principal":
        return cls(kind="user", id=str(user.get_username()), user=user)

    @classmethod
    def agent(cls, agent_id: str) -> "Principal":
        return cls(kind="agent", id=agent_id)

    @classmethod
    def system(cls, name: str) -> "Principal":
        return cls(kind="system", id=name)

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"
