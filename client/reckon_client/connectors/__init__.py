"""Connectors for real systems, each a ``reckon_client.Connector`` with ``fence`` (docs/integrations.md):

    from reckon_client.connectors.postgres import PostgresConnector   # pip install 'reckon-client[postgres]'
    from reckon_client.connectors.s3 import S3Connector               # pip install 'reckon-client[s3]'
    from reckon_client.connectors.http import HttpConnector, HttpApi  # httpx, already a dependency

Each answers with reckon_client's outcomes and never raises for a remote's answer. A request is ``{"action": …,
"input": {…}, "not_after": "<ISO 8601>"}``; a request that reaches the remote after its deadline is refused with no
effect (``Failed("dependency_unavailable")``), and ``fence(op_key)`` makes a "not found" final at once.

This package imports neither psycopg nor boto3: each connector's module imports its own library, so ``import
reckon_client`` needs neither.
"""

from reckon_client.connectors.common import SourceNotFound

__all__ = ["SourceNotFound"]
