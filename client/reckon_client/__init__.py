"""Reckon's Python client (placeholder: being written)."""
