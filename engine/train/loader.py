"""The data side of a rank's loop: where it is in its batches, and the next batch
prepared (moved to the device) while the current step runs."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.train.builder import (
    TrainParts,
)


class Prefetch:
    """The next optimizer step's micro-batches, collated and prepared in one thread while
    the current step computes; the data position a checkpoint records is that of the
    steps handed out, not of the one prepared ahead."""

    def __init__(self, cursor: DataCursor, prepare: Callable[[Any], Any] | None,
                 steps: int) -> None:
        self.cursor = cursor
        self.prepare = prepare or (lambda b: b)
        self.left = steps
        self.handed = cursor.state()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch")
        self._ahead = self._submit()

    def _load(self) -> tuple[list[Any], dict[str, int]]:
        batches = [self.prepare(b) for b in self.cursor.next_step()]
        return batches, self.cursor.state()

    def _submit(self) -> Any:
        if self.left <= 0:
            return None
        self.left -= 1
        return self._pool.submit(self._load)

    def next_step(self) -> list[Any]:
        ahead = self._ahead or self._pool.submit(self._load)
        batches, self.handed = ahead.result()
        self._ahead = self._submit()
        return batches

    @property
    def epoch(self) -> int:
        return self.handed["epoch"]

    def state(self) -> dict[str, int]:
        return dict(self.handed)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class DataCursor:
    """Epoch and optimizer step inside it: the only data state a checkpoint needs."""

    def __init__(self, parts: TrainParts, epoch: int = 0, position: int = 0) -> None:
        self.parts = parts
        self.epoch = epoch
        self.position = position

    def next_step(self) -> list[Any]:
        if self.position >= self.parts.steps_per_epoch:
            self.epoch += 1
            self.position = 0
        batches = self.parts.step_batches(self.epoch, self.position)
        self.position += 1
        return batches

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}
