"""``strata sim``: the fleet simulator.

It replays request traces through simulated replicas of one or more InferenceServices that share
a GPU budget, and drives the project's own decision code wherever a decision is made: the
built-in autoscaler (``strata.operator.autoscale``: signals and ``decide``), the ServiceTier
models loaded from the chart's default tiers, the engine's HBM block manager and the KV-tier
sidecar's eviction orders for each replica's cache. Only the passage of time is modelled: each
engine step costs what the profile (``profile.py``) says. Pure Python: no torch, no cluster.

Layers import downward: trace, profile, tiers -> cache -> replica -> fleet -> policies -> run ->
report, plot, cli.
"""
