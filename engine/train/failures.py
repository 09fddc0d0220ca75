"""Failures that must end a run at once, and the stop-flag poll that must not invent one.

Ray Train restarts the worker group after any worker error, up to
`FailureConfig(max_failures)` times, resuming from the last checkpoint. That
is right for a killed process and wrong for a failure that will happen again
the same way: a CUDA out-of-memory replays the same step into the same wall
(each restart reloading the model first), and a full disk fills up again.
Workers turn those into `FatalTrainingError` (picklable, one sentence and a
hint), and `NoRetryOnFatal` (used by the launcher) makes Ray raise instead of
retrying when any worker failed with one.

This module imports neither torch nor ray at import time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: seconds one poll of the stop flag may wait for the flag actor's answer
STOP_POLL_TIMEOUT_S = 2.0


class FatalTrainingError(RuntimeError):
    """A worker failure that a restart cannot fix (kind: "out_of_memory", "disk_full")."""

    def __init__(self, kind: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.message, self.hint))

    def __str__(self) -> str:
        return self.message


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        base = getattr(exc, "_base_exc", None)  # Ray's UserExceptionWithTraceback
        exc = base if isinstance(base, BaseException) else (exc.__cause__ or exc.__context__)


def last_line(exc: BaseException) -> str:
    """The actual error of a Ray-wrapped exception: its message carries the remote
    traceback, whose last line is the error itself."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def is_out_of_memory(exc: BaseException | None) -> bool:
    """A CUDA (or other accelerator) out-of-memory anywhere in the exception chain."""
    for e in _chain(exc):
        if isinstance(e, FatalTrainingError):
            return e.kind == "out_of_memory"
        if type(e).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, no torch import
            return True
        text = str(e)
        if "CUDA out of memory" in text or "CUDA error: out of memory" in text:
            return True
    return False


def fatal_of(exc: BaseException | None) -> FatalTrainingError | None:
    """The FatalTrainingError in `exc` (or among a Ray WorkerGroupError's worker failures)."""
    failures = getattr(exc, "worker_failures", None)
    if isinstance(failures, dict):
        for rank in sorted(failures):
            found = fatal_of(failures[rank])
            if found is not None:
                return found
    for e in _chain(exc):
        if isinstance(e, FatalTrainingError):
            return e
    return None


def out_of_memory_error(exc: BaseException, rank: int, step: int, device: Any,
                        advice: list[str] | None) -> FatalTrainingError:
    """One sentence for a CUDA OOM on `rank` during `step`, the plan's advice as the hint."""
    where = f"while loading the model on rank {rank}" if step <= 0 else \
        f"on rank {rank} at step {step}"
    used = ""
    try:
        import torch

        if device is not None and getattr(device, "type", "") == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            used = f" ({(total - free) / (1 << 30):.1f} of {total / (1 << 30):.1f} GiB in use)"
    except Exception:  # the device may be unusable right after the failure
        used = ""
    hint = " ".join(advice or []) or ("Lower --batch-size, turn on --activation-checkpointing "
                                      "or --cpu-offload, train --trainable lora, or use more "
                                      "GPUs.")
    return FatalTrainingError("out_of_memory", f"Training ran out of GPU memory {where}{used}.",
                              hint)


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
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError

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


def no_retry_policy_class() -> type:
    """Ray's default failure policy, except that a FatalTrainingError is raised at once."""
    from ray.train.v2._internal.execution.failure_handling import (
        DefaultFailurePolicy,
        FailureDecision,
    )

    class NoRetryOnFatal(DefaultFailurePolicy):
        def make_decision(self, training_failed_error: Any) -> Any:
            if fatal_of(training_failed_error) is not None:
                return FailureDecision.RAISE
            return super().make_decision(training_failed_error)

    return NoRetryOnFatal
