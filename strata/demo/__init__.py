"""``strata demo``: the whole platform on one machine, end to end.

A real control plane with fake GPU nodes, the Helm chart, the operator running under the chart's
ServiceAccount, a tenant's InferenceService reconciled to Ready; then the data plane the operator
rendered (its ConfigMap) served for real by the torch worker and the KV-tier sidecar, with the
same long prompt answered cold, from HBM, from DRAM after a worker restart, and from NVMe after
both restart.
"""
