"""The API's refusals as one exception: every error Reckon answers is problem+json with a stable ``code``."""

from typing import Any


class ApiError(Exception):
    """Reckon refused a request (nothing was changed). ``code`` is stable (docs/api.md's table); ``problem`` is the
    whole RFC 9457 body (``current_version`` on a 412, ``errors`` on a 422, …)."""

    def __init__(self, status: int, code: str, detail: str = "", problem: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}" if detail else f"{status} {code}")
        self.status, self.code, self.detail = status, code, detail
        self.problem: dict[str, Any] = problem or {}

    @classmethod
    def of(cls, status: int, body: Any) -> "ApiError":
        problem = body if isinstance(body, dict) else {}
        code = str(problem.get("code") or f"http_{status}")
        return cls(status, code, str(problem.get("detail") or ""), problem)
