"""The worker's view of the user's Stop: a Ray actor on the driver, polled every step.

Ray-side (it calls `ray.get`); the training loop itself takes any callable, so the
Ray-free GPU proof runs the same loop without this module.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError

#: seconds one poll of the stop flag may wait for the flag actor's answer
STOP_POLL_TIMEOUT_S = 2.0


class StopPoller:
    """Worker side: is the user's Stop set? Never blocks a step for long, never guesses.

    The flag is a tiny actor on the driver. A slow answer (the driver busy,
    the head node loaded) is not a stop: the request stays pending and the
    next step looks again. Only an actor that is gone for good (the driver
    died) counts as a stop, since nobody is left to use the rest of the run.
    """

    def __init__(self, flag: Any, timeout_s: float = STOP_POLL_TIMEOUT_S) -> None:
        self.flag = flag
        self.timeout_s = timeout_s
        self._pending: Any = None

    def __call__(self) -> bool:
        if self.flag is None:
            return False
        try:
            if self._pending is None:
                self._pending = self.flag.is_set.remote()
            value = ray.get(self._pending, timeout=self.timeout_s)
        except GetTimeoutError:
            return False  # keep the request; its answer is read next step
        except ActorUnavailableError:
            self._pending = None  # transient (restarting, network): ask again next step
            return False
        except Exception:  # the flag actor died with the driver: stop
            return True
        self._pending = None
        return bool(value)
