"""The agent REST API (/api/v1/): token-authenticated, a thin layer over the same services as the console."""
