"""One retry policy (HOUSE-3): every loop that waits and tries again takes a `RetryPolicy` value.

    WAIT = RetryPolicy(initial_interval_s=0.2, maximum_interval_s=2.0)
    attempt = 0
    while True:
        try:
            return await step()
        except Exception:
            attempt += 1
            if not WAIT.allows(attempt):
                raise
            await asyncio.sleep(WAIT.delay_s(attempt))

Like Temporal's `RetryPolicy`: an initial interval, a backoff coefficient, a maximum interval and
a maximum number of attempts. The policy is pure (no clock, no sleeping): the loop that waits
is its caller's, and so is the choice of which errors are worth another try. Here, in the
lowest room with behaviour, so every room (bus, store, infra, actors, …) can take one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before each retry, and how many attempts in all.

    `delay_s(n)` = initial × coefficient^(n-1), capped at the maximum (by default 100 × the
    initial interval, as Temporal's); `maximum_attempts` 0 means no bound (the caller's deadline
    or error class ends the loop)."""

    initial_interval_s: float
    backoff_coefficient: float = 2.0
    maximum_interval_s: float | None = None
    maximum_attempts: int = 0

    def __post_init__(self) -> None:
        if not self.initial_interval_s > 0:
            raise ValueError(f"initial_interval_s must be positive, got {self.initial_interval_s}")
        if not self.backoff_coefficient >= 1:
            raise ValueError(f"backoff_coefficient must be at least 1, got {self.backoff_coefficient}")
        if self.maximum_interval_s is not None and not self.maximum_interval_s >= self.initial_interval_s:
            raise ValueError(f"maximum_interval_s must be at least initial_interval_s "
                             f"({self.initial_interval_s}), got {self.maximum_interval_s}")
        if self.maximum_attempts < 0:
            raise ValueError(f"maximum_attempts must be 0 (no bound) or more, got {self.maximum_attempts}")

    @property
    def cap_s(self) -> float:
        """The longest wait: the maximum interval, else 100 × the initial one."""
        return self.maximum_interval_s if self.maximum_interval_s is not None else 100 * self.initial_interval_s

    def delay_s(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 for the first retry)."""
        if retry < 1:
            raise ValueError(f"retry counts from 1, got {retry}")
        cap, exponent = self.cap_s, retry - 1
        # past the cap the answer is the cap, computed without a power that overflows on a long outage
        if self.backoff_coefficient > 1 and exponent >= math.log(cap / self.initial_interval_s,
                                                                  self.backoff_coefficient):
            return cap
        return min(cap, self.initial_interval_s * self.backoff_coefficient ** exponent)

    def allows(self, attempts: int) -> bool:
        """Whether another attempt may follow the `attempts` made so far."""
        return self.maximum_attempts == 0 or attempts < self.maximum_attempts
