"""The served voices, kept current beside the rendering.

A server answers `describe` (Wyoming), `GET /v1/audio/voices` and /health from what is
held here, on its event loop, without reading the disk: while a batch renders, a read
(or a rescan on a thread beside it) waits for the interpreter lock at every file it
touches, and Home Assistant gives a `describe` one second. A background task looks at
the change stamp of what is served (`voices.served_stamp`: a few stats) every `POLL_S`,
and at once when a listing asks (`poke`); only when it changed does it rescan the disk
on a thread, read each voice's trained styles there, and swap the fresh voices in
(`Pool.sync`). A voice exported, trained or added meanwhile is listed from then on.

Without the background task (a Ray Serve replica's app, a test's bare app) a listing
reads the disk itself (`listing`), as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from engine.core.errors import VoxshardError
from engine.serve.pool import Pool
from engine.serve.voices import ServedVoice

#: how often the background task looks at the change stamp (seconds)
POLL_S = 1.0
#: a stamp this young may have missed a second change in the same tick of the file
#: system's clock: the next look rescans again (as `catalog.is_current`)
RACY_NS = 2_000_000_000

#: the stamp of voices never read (or read too soon after a change to trust)
UNREAD = object()

Rescan = Callable[[], dict[str, ServedVoice]]
Stamp = Callable[[], Any]


def _styles(voices: dict[str, ServedVoice]) -> dict[str, list[str]]:
    """Each voice's trained styles, read from disk (run on a thread)."""
    return {name: voice.styles for name, voice in voices.items()}


def _newest_ns(stamp: Any) -> int:
    """The newest modification time in a stamp of (what, mtime, size) parts (0: none)."""
    if isinstance(stamp, int):
        return stamp
    if not isinstance(stamp, tuple):
        return 0
    return max((p[1] for p in stamp if isinstance(p, tuple) and len(p) == 3
                and isinstance(p[1], int)), default=0)


class VoiceWatch:
    """The voices a server lists, current beside the rendering (see the module)."""

    def __init__(self, pool: Pool, rescan: Rescan, stamp: Stamp,
                 poll_s: float = POLL_S) -> None:
        self.pool, self._rescan, self._stamp, self.poll_s = pool, rescan, stamp, poll_s
        #: each served name's trained styles, as last read beside the rendering
        self.styles: dict[str, list[str]] = {}
        #: the stamp the voices were last read at (`UNREAD`: read them at the next look)
        self.stamp: Any = UNREAD
        #: disk rescans since the start (the request path never makes one)
        self.rescans = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None

    def prime(self) -> None:
        """Read the stamp and the styles of the voices served now (at the start, before
        the loop serves: blocking)."""
        self.stamp = self._stamp()
        self.styles = _styles(self.pool.voices)
        if _newest_ns(self.stamp) >= time.time_ns() - RACY_NS:
            self.stamp = UNREAD

    def styles_of(self, voice: ServedVoice) -> list[str]:
        """A voice's trained styles as last read ([] until read: one a client registered
        since is read at the next look, and an instant voice has none)."""
        return self.styles.get(voice.name, [])

    # -- the background task ---------------------------------------------------------------
    def start(self) -> None:
        """Look at the stamp every `poll_s` from now on (call on the serving loop)."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="voxshard-voice-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def running(self) -> bool:
        """The background task keeps the voices current."""
        return self._task is not None

    def poke(self) -> None:
        """Look at the stamp now (a client is listing the voices), without waiting."""
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            self._wake.clear()
            try:
                await self.refresh()
            except VoxshardError:
                pass  # a folder given on the command line went away: the voices known stay

    async def listing(self) -> None:
        """Before a listing is answered: with the background task running, the voices held
        are current (it is asked to look now, for the next listing); without it, they are
        read from disk here."""
        if self.running:
            self.poke()
        else:
            await self.refresh(force=True)

    async def refresh(self, force: bool = False) -> bool:
        """Rescan the disk, on a thread, when the stamp changed since the last scan (or
        `force`), and serve what it found; whether it rescanned. A refusal of the rescan
        (a folder given on the command line went away) leaves the voices served as they
        are and is raised."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one scan at a time; a second asker finds it fresh
            stamp = await asyncio.to_thread(self._stamp)  # before the scan: see RACY_NS
            if not force and stamp == self.stamp:
                return False
            known = set(self.pool.voices)
            found, styles = await asyncio.to_thread(self._read)
            self.rescans += 1
            # a voice a client registered while the scan ran stays (the next scan finds it)
            added = {n: v for n, v in self.pool.voices.items() if n not in known}
            # a worker no served name uses any more is closed
            await self.pool.sync({**added, **found})
            self.styles = styles
            racy = _newest_ns(stamp) >= time.time_ns() - RACY_NS
            self.stamp = UNREAD if racy else stamp
            return True

    def _read(self) -> tuple[dict[str, ServedVoice], dict[str, list[str]]]:
        found = self._rescan()
        return found, _styles(found)
