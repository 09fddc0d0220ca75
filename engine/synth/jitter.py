"""When to start playing speech that is still being generated (a jitter buffer).

Playing the first piece at once stutters whenever generation runs slower than
real time: the player catches up and plays silence. Starting later costs
latency but no gaps. `PrebufferPolicy` decides from the generation speed
measured so far:
- generation at least `fast_rate` x real time: start once `min_s` is buffered;
- slower, with the expected total length known: start once the buffer covers
  what playback would otherwise overtake, `remaining * (1 / rate - 1)` (the
  time generating the rest takes beyond playing it), times `margin`;
- never later than `max_delay_s` after the first audio, and at once when
  everything has been generated.

Pure Python (no numpy, no torch): the engine's `stream.Player` uses it and the
GUI's player can too. Times are in seconds of a monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrebufferPolicy:
    min_s: float = 0.25
    max_delay_s: float = 4.0
    fast_rate: float = 1.1
    margin: float = 1.25
    #: expected length of the whole speech (None: unknown; then slow generation
    #: waits for `max_delay_s`)
    expected_s: float | None = None
    first_at: float | None = None
    first_s: float = 0.0
    produced_s: float = 0.0

    def wrote(self, now: float, seconds: float) -> None:
        """`seconds` of audio became available at `now`."""
        if self.first_at is None:
            self.first_at = now
            self.first_s = seconds
        self.produced_s += seconds

    def rate(self, now: float) -> float | None:
        """Audio seconds generated per second since the first piece (None: too early).
        Measured up to `now`, not to the last piece: a stall lowers it at once."""
        if self.first_at is None or now - self.first_at < 0.05:
            return None
        return (self.produced_s - self.first_s) / (now - self.first_at)

    def needed_s(self, now: float) -> float | None:
        """Buffered seconds needed to play to the end without a gap (None: not known yet)."""
        rate = self.rate(now)
        if rate is None or rate <= 0:
            return None
        if rate >= self.fast_rate:
            return self.min_s
        if self.expected_s is None:
            return None
        remaining = max(0.0, self.expected_s - self.produced_s)
        return max(self.min_s, remaining * (1.0 / rate - 1.0) * self.margin)

    def ready(self, now: float, played_s: float, finished: bool) -> bool:
        if finished:
            return True
        if self.first_at is None:
            return False
        if now - self.first_at >= self.max_delay_s:
            return True
        buffered = self.produced_s - played_s
        if buffered < self.min_s:
            return False
        needed = self.needed_s(now)
        return needed is not None and buffered >= needed
