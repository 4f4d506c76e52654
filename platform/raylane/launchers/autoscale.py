"""How many replicas a serving deployment should have, and which replica lease goes back first. Pure: no Ray, no
clock (``now`` is an argument), so the serving driver and the tests run the same decisions.

Words
- *desired*: ``ceil(ongoing requests / target_ongoing_requests)``, clamped to ``[min_replicas, max_replicas]``:
  what the load alone asks for at one instant.
- *target*: the replicas the deployment wants (``ReplicaScaler.observe``). It moves to the desired count once that
  has stayed above it for the upscale delay (to the smallest desired count seen meanwhile, so one spike does not
  buy the maximum) or below it for the downscale delay (to the largest seen meanwhile). The driver brings the
  replicas it holds towards the target as fast as leases are admitted and allowed to go back.
- *hold*: how long a replica lease has been granted. A lease goes back (and its GPU to the training that waits)
  only once held for at least the downscale delay, so a reclaimed GPU is not handed back by the next lull.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

__all__ = ["Autoscaling", "Decision", "ReplicaScaler", "desired_replicas", "pick_release"]


@dataclass(frozen=True)
class Autoscaling:
    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float
    upscale_delay_s: float
    downscale_delay_s: float

    @classmethod
    def from_spec(cls, spec) -> "Autoscaling":
        """From a ``raylane.config.serve.AutoscalingSpec``."""
        return cls(spec.min_replicas, spec.max_replicas, spec.target_ongoing_requests, spec.upscale_delay,
                   spec.downscale_delay)


@dataclass(frozen=True)
class Decision:
    target: int
    desired: int
    reason: str


def desired_replicas(cfg: Autoscaling, ongoing: float) -> int:
    # The epsilon keeps 4 ongoing at target 2 at 2 replicas, not 3, despite float division.
    n = math.ceil(max(0.0, ongoing) / cfg.target_ongoing_requests - 1e-9)
    return max(cfg.min_replicas, min(cfg.max_replicas, n))


class ReplicaScaler:
    """Turns a stream of (now, ongoing requests) into the deployment's target, with up- and down-scale delays.

    The target starts at ``min_replicas`` and moves only after a delay; between moves it stays put, whatever the
    driver has managed to do about it so far (a lease still pending, a lease not yet held long enough to go back).
    Not thread-safe; one per deployment, fed by one loop.
    """

    def __init__(self, cfg: Autoscaling):
        self.cfg = cfg
        self.target = cfg.min_replicas
        self._since: Optional[float] = None
        self._direction = 0
        self._bound = 0

    def observe(self, now: float, ongoing: float) -> Decision:
        cfg = self.cfg
        desired = desired_replicas(cfg, ongoing)
        direction = (desired > self.target) - (desired < self.target)
        if direction == 0:
            self._since, self._direction = None, 0
            return Decision(self.target, desired, "steady")
        if direction != self._direction or self._since is None:
            self._since, self._direction, self._bound = now, direction, desired
        # Up: the smallest desired count seen while waiting; down: the largest. One sample does not decide.
        self._bound = min(self._bound, desired) if direction > 0 else max(self._bound, desired)
        delay = cfg.upscale_delay_s if direction > 0 else cfg.downscale_delay_s
        waited = now - self._since
        if waited < delay:
            verb = "upscale" if direction > 0 else "downscale"
            return Decision(self.target, desired, f"{verb} to {self._bound} in {delay - waited:.1f}s")
        before, self.target = self.target, self._bound
        self._since, self._direction = None, 0
        return Decision(self.target, desired, f"{ongoing:g} ongoing vs {before} x {cfg.target_ongoing_requests:g} "
                                              f"for {waited:.1f}s: {before} -> {self.target}")


def pick_release(held: Sequence[Tuple[str, float]], now: float, min_hold_s: float) -> Optional[str]:
    """Of ``(lease id, granted at)`` pairs, the lease to give back: the most recently granted one among those held
    for at least ``min_hold_s`` (the last GPU reclaimed is the first returned); None while none has been."""
    ready = [(t, wid) for wid, t in held if now - t >= min_hold_s]
    return max(ready)[1] if ready else None
