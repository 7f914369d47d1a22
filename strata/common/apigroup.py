"""The Strata API's group and version: the operator serves its CRDs under them, and the tools
that write InferenceServices and ServiceTiers (the demo, the local stack) name them."""

from __future__ import annotations

GROUP = "strata.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
