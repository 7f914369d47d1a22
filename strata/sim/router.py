"""Which ready replica takes a request: the one adapter between the fleet and a routing choice.

Until the project's router (issue 9, ``strata.router.choose``) is on main, requests go to a
replica picked uniformly at random, as a Kubernetes Service's kube-proxy spreads connections.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from strata.sim.requests import Seq
from strata.sim.service import Pod


class Router:
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, seq: Seq, pods: Sequence[Pod]) -> Pod:
        return pods[0] if len(pods) == 1 else self.rng.choice(pods)
