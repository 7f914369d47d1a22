"""The data plane: the torch inference engine and the tiered KV-cache sidecar.

Knows nothing of Kubernetes. ``strata.worker.config`` (the file schema the operator renders)
must stay importable without torch."""
