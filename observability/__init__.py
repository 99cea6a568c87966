"""Observability: Prometheus metrics read from the database at scrape time, structured logs, traces.

Nothing in the domain (tasks, leases, audit, retention) imports this package: it only reads the domain's rows and
formats what others log."""
