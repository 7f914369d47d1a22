"""Shared fixtures: ``cluster`` (session-scoped test control plane), ``namespace`` (per test) and
``prometheus`` (session-scoped, started only for the tests that ask for it).

Defined in strata.cluster.pytest_plugin so other projects' suites could load them too;
see docs/cluster.md for the API.
"""

pytest_plugins = ["strata.cluster.pytest_plugin", "strata.observe.pytest_plugin"]
