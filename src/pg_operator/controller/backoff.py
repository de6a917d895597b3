"""Capped exponential backoff with jitter for failed reconciles."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base: float = 0.5
    cap: float = 60.0
    # Fraction of the delay that is randomised: delay * (1 - jitter/2 .. 1 + jitter/2).
    jitter: float = 0.5

    def delay(self, failures: int, rand: float | None = None) -> float:
        """Seconds to wait before the next attempt after `failures` consecutive failures (>= 1)."""
        if failures < 1:
            return 0.0
        raw = min(self.cap, self.base * (2.0 ** min(failures - 1, 62)))
        r = random.random() if rand is None else rand
        return min(self.cap, raw * (1.0 - self.jitter / 2.0 + self.jitter * r))


def jittered(interval: float, fraction: float = 0.1, rand: float | None = None) -> float:
    """`interval` spread by ±fraction so that many clusters' resyncs do not fire at the same instant."""
    r = random.random() if rand is None else rand
    return interval * (1.0 - fraction + 2.0 * fraction * r)
