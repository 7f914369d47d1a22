"""Strata: a Kubernetes platform for LLM inference with a tiered KV cache.

The control plane lives in ``strata.operator`` and the data plane in ``strata.worker``
(the top-level ``operator/`` and ``worker/`` folders); neither imports the other, except
that the operator renders the worker's torch-free config schema (``strata.worker.config``).
"""

__version__ = "0.1.0"
