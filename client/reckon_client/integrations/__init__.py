"""Reckon-guarded tools for agent frameworks, over ``reckon_client.tools`` (one module per framework; each imports
its framework, so install it with the client's matching extra)."""
