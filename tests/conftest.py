"""Shared fixtures: ``cluster`` (session-scoped test control plane) and ``namespace`` (per test).

Defined in strata.cluster.pytest_plugin so other projects' suites could load them too;
see docs/cluster.md for the API.
"""

pytest_plugins = ["strata.cluster.pytest_plugin"]
