"""The router's own record of load: prefill tokens it sent an endpoint, decayed over time.

No one needs to be asked, so it works before any worker reports anything, and it measures what
the load imbalance is judged on (prefill tokens per replica over a minute). The time constant
(30 s) follows that one-minute window: long enough to smooth single requests, short enough that
an idle replica becomes attractive again within a window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY_S = 30.0


@dataclass
class DecayedTokens:
    """``value(now)`` = sum of ``tokens * exp(-(now - t) / decay_s)`` over what was ``add``-ed."""

    decay_s: float = DECAY_S
    _value: float = 0.0
    _at: float = 0.0

    def value(self, now: float) -> float:
        return self._value * math.exp(-max(0.0, now - self._at) / self.decay_s)

    def add(self, tokens: float, now: float) -> None:
        self._value = self.value(now) + tokens
        self._at = max(self._at, now)
