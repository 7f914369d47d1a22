"""vLLM behind an InferenceService: Strata's KV connector (``connector``, the only module that
imports vLLM), its block bookkeeping and cache layout, the block keys it shares with the router,
and the KV-tier sidecar's relay of vLLM's KV events to the routers."""
