"""Strata: a Kubernetes platform for LLM inference with a tiered KV cache.

Three planes: the operator (``strata.operator``, the top-level ``operator/`` folder), the router
(``strata.router``) and the worker with its KV-tier sidecar (``strata.worker``). What they share
is in ``strata.common``, which imports none of them: the OpenAI API's protocol, errors, auth and
request ids; the cache tiers' names; ports, HTTP paths and the block size; the Strata API's group
and version; the KV-tier sidecar's and the router's memory arithmetic; the JSON logs.

Beyond it, the operator renders the worker's and the router's config schemas
(``strata.worker.config``, ``strata.router.config``), and the router admits requests with the
worker's torch-free tokenizer, request limits and block hashes, so that its answers and hashes
are the worker's. No plane imports another's server, engine or KV tiers; the operator and the
router never load torch, the worker never loads kopf or kubernetes. pyproject.toml states these
as import-linter contracts (``lint-imports``, run by ``make lint``).
"""

__version__ = "0.1.0"
