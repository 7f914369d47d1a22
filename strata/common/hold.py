"""While a service has no ready replica (scaled to zero, waking up), its router holds requests
instead of refusing them: these many at most, each this long at most, unless its ServiceTier
says otherwise (the operator's API defaults and the router's config both start from these)."""

from __future__ import annotations

HOLD_MAX_REQUESTS = 256
HOLD_TIMEOUT_S = 300
# The router's gauge of the requests it holds: the operator's autoscaler reads it to wake a
# service at zero.
HELD_REQUESTS_METRIC = "strata_router_held_requests"
