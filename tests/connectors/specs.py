"""How a test names a connector in JSON (for the child process of the crash test) and builds it again.

Imports only reckon_client's connectors: the child process starts with nothing else.
"""

from typing import Any

from reckon_client.connectors.http import HttpApi, HttpConnector, Route

# The harness API's routes (harness/idempotent_api.py).
HARNESS_API = HttpApi(
    actions={
        "transfer": Route("POST", "/v1/transfers"),
        "reverse": Route("POST", "/v1/transfers/{id}/reversal"),
    },
    lookup=Route("GET", "/v1/idempotency/{op_key}"),
    fence=Route("POST", "/v1/idempotency/{op_key}/fence"),
    delete=Route("DELETE", "/v1/transfers/{locator}"),
    version=Route("GET", "/v1/sources/{locator}"),
)


def connector_from_spec(spec: dict[str, Any]) -> Any:
    kind = spec["kind"]
    if kind == "postgres":
        from reckon_client.connectors.postgres import PostgresConnector

        return PostgresConnector(source=spec["source"], target=spec["target"], **spec.get("options", {}))
    if kind == "s3":
        from reckon_client.connectors.s3 import S3Connector

        return S3Connector.connect(
            spec["bucket"],
            endpoint_url=spec["endpoint_url"],
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            timeout=spec.get("timeout", 5.0),
            **spec.get("options", {}),
        )
    if kind == "http":
        return HttpConnector(spec["url"], HARNESS_API, timeout=spec.get("timeout", 5.0))
    raise ValueError(f"no connector kind {kind!r}")
