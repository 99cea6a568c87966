"""Reckon for MCP, over stdio (the token may come from RECKON_TOKEN instead of the command line, where other users
of the machine could read it):

    python -m reckon_client.mcp agent --url URL                       the agent protocol as MCP tools
    python -m reckon_client.mcp gateway --url URL --session S -- CMD  CMD's tools, each call through Reckon
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
    gateway = commands.add_parser("gateway", help="serve another MCP server's tools, each call through Reckon")
    gateway.add_argument("--url", required=True, help="Reckon's base URL")
    gateway.add_argument("--token", default=os.environ.get("RECKON_TOKEN", ""), help="the agent token (RECKON_TOKEN)")
    gateway.add_argument("--session", required=True, help="this agent session's id: its calls' project in Reckon")
    gateway.add_argument("--journal", default=None, help="a SQLite file recording each call's task and output ref")
    gateway.add_argument("--approve", default="", help="comma-separated tools whose every call a person approves")
    gateway.add_argument("--lease-ttl", type=int, default=30, help="seconds a call's lease lasts unrenewed")
    gateway.add_argument("upstream", nargs=argparse.REMAINDER, help="-- the MCP server's command and arguments")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("an agent token is needed: --token or RECKON_TOKEN")
    if args.command == "gateway":
        upstream = args.upstream[1:] if args.upstream[:1] == ["--"] else args.upstream
        if not upstream:
            parser.error("the MCP server to put Reckon in front of: -- COMMAND [ARGS…]")
        approve = frozenset(name.strip() for name in args.approve.split(",") if name.strip())
        from reckon_client.mcp.gateway import serve  # the SDK is the extra's: imported once the arguments are good

        serve(
            args.url,
            args.token,
            upstream,
            session=args.session,
            journal=args.journal,
            approve=approve,
            ttl=args.lease_ttl,
        )
        return 0
    from reckon_client.mcp.agent import AgentRuns
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
