"""One process-wide gate between CUDA graph captures and every other thread's GPU work.

A capture records kernels instead of running them; while it lasts, another
thread's allocation, synchronisation or launch on the legacy stream breaks it
("operation not permitted when stream is capturing"), and two captures at
once break the one-capture-per-process rule. A speech worker has three
threads on the GPU: the batcher (frames, and a capture whenever it builds a
batch of a new shape), the finisher (decoding the previous requests) and a
streamed request's own thread (its frames and captures).

So GPU work runs in `section()`s, which run together, and a capture runs in
`capture()`, which runs alone: it waits until no other thread is inside a
section and keeps new ones out until it is done (a waiting capture is served
before new sections, so it cannot starve). Sections nest, and a thread may
capture from inside its own section: while it waits, its own sections count
as left (it does no GPU work while waiting), so two threads that both capture
from inside a section cannot deadlock. The capture itself uses CUDA's
thread-local error mode, so the checks apply to the capturing thread only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class GpuGate:
    """Sections run together; a capture runs alone (see the module doc)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holds: dict[int, int] = {}  # thread id -> open sections
        self._capturing: int | None = None  # the thread id that captures now
        self._waiting = 0  # captures waiting for the sections to drain

    def inside(self) -> set[int]:
        """Thread ids inside a section now (for checks and tests)."""
        with self._cond:
            return {t for t, n in self._holds.items() if n > 0}

    @contextmanager
    def section(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if not self._holds.get(me) and self._capturing != me:
                self._cond.wait_for(lambda: self._capturing is None and not self._waiting)
            self._holds[me] = self._holds.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._holds[me] - 1
                if left:
                    self._holds[me] = left
                else:
                    del self._holds[me]
                self._cond.notify_all()

    @contextmanager
    def capture(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._capturing == me:
                raise RuntimeError("a CUDA graph capture cannot start inside another")
            mine = self._holds.pop(me, 0)  # counted as left while waiting
            self._waiting += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._capturing is None and not self._holds)
            self._waiting -= 1
            self._capturing = me
        try:
            yield
        finally:
            with self._cond:
                self._capturing = None
                self._cond.notify_all()
                if mine:
                    # back into its sections, behind any capture that waits now
                    self._cond.wait_for(lambda: self._capturing is None)
                    self._holds[me] = mine


#: the one gate of this process (every model and batch of a worker shares the GPU)
GATE = GpuGate()

#: CUDA's capture error mode: unsafe calls are refused in the capturing thread only
CAPTURE_ERROR_MODE = "thread_local"
