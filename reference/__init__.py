"""Reference agents: example task kinds written only against Reckon's public services."""
