"""``python -m reckon_client.mcp agent --url URL --token TOKEN``: the agent protocol as MCP tools, over stdio.

The token may come from RECKON_TOKEN instead of the command line (where other users of the machine could read it).
"""

import argparse
import os
import sys

from reckon_client.sync import Reckon


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reckon_client.mcp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    agent = commands.add_parser("agent", help="serve the agent protocol as MCP tools over stdio")
    agent.add_argument("--url", required=True, help="Reckon's base URL, e.g. http://127.0.0.1:8000")
    agent.add_argument("--token", default=os.environ.get("RECKON_TOKEN", ""), help="the agent token (RECKON_TOKEN)")
    agent.add_argument("--lease-ttl", type=int, default=120, help="seconds a lease lasts unrenewed (5 to 3600)")
    agent.add_argument(
        "--lease-wait", type=float, default=0.0, help="seconds to keep asking for a lease another holder has"
    )
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("an agent token is needed: --token or RECKON_TOKEN")
    from reckon_client.mcp.agent import AgentRuns  # the SDK is the extra's: imported once the arguments are good
    from reckon_client.mcp.server import build_server

    with Reckon(args.url, args.token) as reckon:
        runs = AgentRuns(reckon, ttl_seconds=args.lease_ttl, lease_wait=args.lease_wait)
        try:
            build_server(reckon, runs).run("stdio")
        finally:
            runs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
