"""The Strata control plane: the API (``strata.operator.api``) and the operator that reconciles it.

Imported as ``strata.operator``: the standard library owns the top-level name ``operator``.
"""
