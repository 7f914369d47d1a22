"""Observability: the Prometheus rules, the Grafana dashboard, the monitor objects' scrape
configuration and a local Prometheus for the tests and the demo."""
