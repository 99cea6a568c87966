"""Reckon for agents that speak MCP (the Model Context Protocol; the official ``mcp`` SDK, the client's extra
``mcp``).

``python -m reckon_client.mcp agent --url … --token …`` serves the agent protocol itself as MCP tools over stdio
(``reckon_client.mcp.agent``): an MCP-capable agent creates a task, asks what to do next, does it against its own
system with the op key Reckon registered first, and reports what the system answered — the lease, the directives,
reconcile-first and the renewals are the server's to keep, as ``Reckon.run`` keeps them for a Python agent.
"""
