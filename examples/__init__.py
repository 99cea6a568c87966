"""Agents written on reckon_client (the reference agent, the HTTP benchmark): they import nothing of the server."""
