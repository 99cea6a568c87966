"""The routers other apps add to the one agent API, named by dotted path from their ``AppConfig.ready()`` (hooks:
the /webhooks routes). api/api.py imports them when it builds the API — which only a process that serves or
describes the API does (through the URLconf), so a worker that skips Django's system checks starts without building
it (the API's schemas cost about 0.2 s of CPU to import). A dotted path, not an import: the app builds on api, not
api on it."""

_added: list[tuple[str, str]] = []


def add_router(prefix: str, dotted_path: str) -> None:
    """Add the router at ``dotted_path`` (``"package.module.name"``) under ``prefix`` when the API is built."""
    if (prefix, dotted_path) not in _added:
        _added.append((prefix, dotted_path))


def added() -> tuple[tuple[str, str], ...]:
    return tuple(_added)
