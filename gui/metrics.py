"""Training metrics kept for the charts, in bounded memory at any run length.

A `Series` holds at most `capacity` points. When it fills up, neighbouring
points are merged pairwise (mean, or max for memory so a peak is never
hidden) and each stored point then stands for twice as many steps. A run of
100k steps therefore costs the same memory and drawing time as one of 4k,
and appending is O(1) amortised. The charts redraw from a timer, never per
event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

_RANK_IN_KEY = re.compile(r"(?:^|/)(?:rank|worker|gpu)[_]?(\d+)(?:/|$)")


class Series:
    def __init__(self, capacity: int = 4096, reduce: str = "mean") -> None:
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number >= 4")
        if reduce not in ("mean", "max"):
            raise ValueError("reduce must be 'mean' or 'max'")
        self.capacity = capacity
        self.reduce = reduce
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self.n = 0
        self.stride = 1  # raw points per stored point
        self._acc_x = 0.0
        self._acc_y = 0.0
        self._acc_n = 0
        self.count = 0  # raw points seen
        self.last: float | None = None
        self.version = 0  # bumped on every change, so charts redraw only when needed

    def append(self, x: float, y: float) -> None:
        if not np.isfinite(y):
            return
        self.count += 1
        self.last = y
        self.version += 1
        self._acc_x = x
        if self._acc_n == 0:
            self._acc_y = y
        elif self.reduce == "max":
            self._acc_y = max(self._acc_y, y)
        else:
            self._acc_y += y
        self._acc_n += 1
        if self._acc_n < self.stride:
            return
        y_out = self._acc_y / self._acc_n if self.reduce == "mean" else self._acc_y
        self._acc_n = 0
        if self.n == self.capacity:
            self._halve()
        self._x[self.n] = self._acc_x
        self._y[self.n] = y_out
        self.n += 1

    def _halve(self) -> None:
        half = self.capacity // 2
        x, y = self._x, self._y
        x[:half] = x[1::2]
        if self.reduce == "max":
            y[:half] = np.maximum(y[0::2], y[1::2])
        else:
            y[:half] = (y[0::2] + y[1::2]) * 0.5
        self.n = half
        self.stride *= 2

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the stored points plus the partial bucket (the newest value)."""
        x, y = self._x[:self.n], self._y[:self.n]
        if self._acc_n:
            tail_y = self._acc_y / self._acc_n if self.reduce == "mean" else self._acc_y
            return np.append(x, self._acc_x), np.append(y, tail_y)
        return x.copy(), y.copy()


@dataclass
class MetricsStore:
    """All series of one run, keyed by metric name (plus `@rank` for per-rank values)."""

    capacity: int = 4096
    series: dict[str, Series] = field(default_factory=dict)
    last_step: float = 0.0
    latest: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> Series:
        s = self.series.get(name)
        if s is None:
            s = Series(self.capacity, "max" if name.startswith(("memory/", "host/")) else "mean")
            self.series[name] = s
        return s

    def add(self, values: dict[str, object]) -> None:
        step_value = values.get("step")
        step = float(step_value) if isinstance(step_value, int | float) else self.last_step
        self.last_step = max(self.last_step, step)
        rank = values.get("rank")
        for key, value in values.items():
            if key in ("step", "rank", "time") or isinstance(value, bool):
                continue
            if not isinstance(value, int | float):
                continue
            name = key
            if key.startswith(("memory/", "host/")):
                m = _RANK_IN_KEY.search(key)
                if m:
                    name = _RANK_IN_KEY.sub("/", key).replace("//", "/").strip("/")
                    name = f"{name}@{m.group(1)}"
                elif rank is not None:
                    name = f"{key}@{rank}"
            self.latest[name] = float(value)
            self.get(name).append(step, float(value))

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.series if n.startswith(prefix))

    def ranks(self) -> list[str]:
        return sorted({n.split("@", 1)[1] for n in self.series if "@" in n},
                      key=lambda r: (len(r), r))

    def clear(self) -> None:
        self.series.clear()
        self.latest.clear()
        self.last_step = 0.0
