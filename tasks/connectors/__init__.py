"""Connectors: how an agent talks to an external system by op key (DESIGN §4, §6)."""
