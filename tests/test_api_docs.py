"""The API's docs page (/api/v1/docs, Swagger UI over /api/v1/openapi.json) opens without a login and loads
nothing from another host: every script, stylesheet and icon it names is one of Reckon's own static files, and each
answers. Checked as the demo serves static files (from the apps' folders) and as a deployment does (collected,
hashed names, by WhiteNoise from STATIC_ROOT)."""

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db

DOCS = "/api/v1/docs"


class _Page(HTMLParser):
    """Every URL-valued attribute of a page (src, href, and the like), and the Swagger UI settings it embeds."""

    URL_ATTRIBUTES = ("src", "href", "srcset", "action", "poster", "data", "formaction")

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []  # (tag, url)
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in self.URL_ATTRIBUTES and value:
                self.urls.append((tag, value))
        if tag == "script":
            self._script = dict(attrs)

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self.scripts.append((self._script, data))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None


def docs_page(client: Client) -> _Page:
    response = client.get(DOCS)
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/html")
    page = _Page()
    page.feed(response.content.decode())
    return page


def _settings_of(page: _Page) -> dict[str, Any]:
    [(_, text)] = [(attrs, data) for attrs, data in page.scripts if attrs.get("id") == "swagger-settings"]
    settings: dict[str, Any] = json.loads(text)
    return settings


@pytest.fixture(params=["demo", "deployed"])
def static_serving(request: pytest.FixtureRequest, settings: Any, tmp_path: Path) -> str:
    """demo: WhiteNoise finds files in the apps' folders (as under DEBUG). deployed: ``collectstatic`` with the
    production storage (hashed names, compressed copies) into STATIC_ROOT, and WhiteNoise serves only those."""
    if request.param == "demo":
        settings.WHITENOISE_USE_FINDERS = True
        settings.WHITENOISE_AUTOREFRESH = True
    else:
        settings.STATIC_ROOT = tmp_path / "static"
        settings.STORAGES = {
            **settings.STORAGES,
            "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
        }
        settings.WHITENOISE_USE_FINDERS = False
        settings.WHITENOISE_AUTOREFRESH = False
        call_command("collectstatic", interactive=False, verbosity=0)
    return str(request.param)


def test_the_docs_page_loads_only_local_static_assets_and_each_answers(client: Client, static_serving: str) -> None:
    page = docs_page(client)  # no login: the page is as open as the OpenAPI document it shows
    assets = [url for tag, url in page.urls if tag in ("script", "link", "img")]
    assert {url for _, url in page.urls} == set(assets)  # nothing else (no links out to another site)
    assert any(url.endswith(".js") for url in assets) and any(url.endswith(".css") for url in assets)
    for url in assets:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{url} is on another host"
        assert parts.path.startswith("/static/"), url
        if static_serving == "deployed":
            assert re.search(r"\.[0-9a-f]{12}\.\w+$", parts.path), f"{url}: not the collected, hashed name"
        answer = client.get(url)
        assert answer.status_code == 200, f"{url} answered {answer.status_code}"
        assert answer.getvalue(), f"{url} is empty"
        answer.close()
    # Only Reckon's scripts run: no inline code beyond the settings' JSON.
    inline = [data for attrs, data in page.scripts if not attrs.get("src") and attrs.get("type") != "application/json"]
    assert not any(code.strip() for code in inline)


def test_swagger_ui_reads_the_local_document_and_calls_no_other_host(client: Client) -> None:
    settings = _settings_of(docs_page(client))
    assert settings["url"] == "/api/v1/openapi.json"
    assert client.get(settings["url"]).status_code == 200
    absolute = [v for v in settings.values() if isinstance(v, str) and urlsplit(v).netloc]
    assert absolute == []
    # Swagger UI's validator badge would send the document to validator.swagger.io: off.
    assert settings["validatorUrl"] is None


def test_the_docs_page_needs_no_token_and_reads_nothing_from_the_database(client: Client, make_task: Any) -> None:
    """The page is static: it shows the schema, not tasks; a console session or none at all get the same page."""
    task = make_task(kind="copy", title="a title only a token may read")
    anonymous = client.get(DOCS)
    assert anonymous.status_code == 200 and task.title.encode() not in anonymous.content
    assert client.get(f"/api/v1/tasks/{task.pk}").status_code == 401  # the API itself stays closed
