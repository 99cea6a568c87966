"""A stdio MCP server with a counting side effect, for the gateway's tests (tests/test_mcp_gateway.py):

    python harness/mcp_payments.py LEDGER [HOLD]

``pay(to, amount)`` appends one line to LEDGER — the remote's own count of effects — and answers the payment; with
HOLD given, it then waits (up to 30 s) for that file to exist before answering, so a test can kill the caller while
the payment is made and its answer not yet given. ``refuse(to)`` answers an error (the server's refusal, no effect).
It cannot be asked what became of a call: as most MCP servers."""

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def build(ledger: Path, hold: Path | None) -> MCPServer:
    server = MCPServer("payments")

    @server.tool()
    def pay(to: str, amount: int) -> dict[str, Any]:
        """Pay `amount` to `to`."""
        payment = {"id": f"pay-{uuid.uuid4().hex[:12]}", "to": to, "amount": amount}
        with ledger.open("a") as out:
            out.write(json.dumps(payment) + "\n")
        if hold is not None:
            deadline = time.monotonic() + 30
            while not hold.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return payment

    @server.tool()
    def refuse(to: str) -> dict[str, Any]:
        """Always refused: the account is closed."""
        raise ToolError(f"the account of {to} is closed")

    return server


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None).run("stdio")
