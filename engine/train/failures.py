"""Failures that must end a run at once, recognised the same way by workers and driver.

Ray Train restarts the worker group after any worker error, up to
`FailureConfig(max_failures)` times, resuming from the last checkpoint. That
is right for a killed process and wrong for a failure that will happen again
the same way: a CUDA out-of-memory replays the same step into the same wall
(each restart reloading the model first), and a full disk fills up again.
Workers turn those into `FatalTrainingError` (picklable, one sentence and a
hint), and the launcher's failure policy (`engine.train.retry_policy`) makes Ray
raise instead of retrying when any worker failed with one.

This module imports neither torch nor ray: the Ray-free GPU proof's workers use it
(the Ray side of stopping and retrying is in `engine.train.stop` and `retry_policy`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from engine.config.change import Change, as_changes
from engine.core.errors import RAY_OOM_TEXT, is_device_out_of_memory

GIB = float(1 << 30)
#: the process Ray's memory monitor chose, in its message
_RAY_OOM_VICTIM = re.compile(r"Selected to kill:.*?task name=([^,]*),.*?pid=(\d+)"
                             r"(?:, actual memory used=([\d.]+)GB)?", re.S)
_RAY_OOM_NODE = re.compile(r"was ([\d.]+)GB used / ([\d.]+)GB limit")
#: Ray's names for the run's processes (task name up to the first dot) -> the app's words
PROCESS_NAMES = {"RayTrainWorker": "a training worker",
                 "TrainController": "Ray Train's controller",
                 "_QueueActor": "the run's metrics queue",
                 "_StopFlag": "the run's stop flag",
                 "_encode_many": "a code-extraction task"}


class FatalTrainingError(RuntimeError):
    """A worker failure that a restart cannot fix (kind: "out_of_memory", "disk_full");
    `changes`: the settings that avoid it (`Change`s)."""

    def __init__(self, kind: str, message: str, hint: str | None = None,
                 changes: tuple[Change, ...] = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.hint = hint
        self.changes = tuple(changes)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.message, self.hint, self.changes))

    def __str__(self) -> str:
        return self.message


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        base = getattr(exc, "_base_exc", None)  # Ray's UserExceptionWithTraceback
        exc = base if isinstance(base, BaseException) else (exc.__cause__ or exc.__context__)


def _every_failure(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`'s chain and, inside Ray Train's errors, each worker's failure (a health check's
    own cause included) and the controller's."""
    for e in _chain(exc):
        yield e
        failures = getattr(e, "worker_failures", None)
        inner = list(failures.values()) if isinstance(failures, dict) else []
        inner += [getattr(e, name, None) for name in ("health_check_failure",
                                                      "controller_failure")]
        for sub in inner:
            if isinstance(sub, BaseException) and sub is not e:
                yield from _every_failure(sub)


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
        if is_device_out_of_memory(e):
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


#: what lowers a run's memory when the plan's own figures are not at hand
OUT_OF_MEMORY_CHANGES = (
    Change("parallel.activation_checkpointing", True,
           "Recompute activations in backward: less memory, ~30% more compute"),
    Change("model.trainable", "lora", "Train LoRA adapters only"),
    Change("parallel.cpu_offload", True,
           "Keep sharded weights and optimizer state in host memory: slower steps"),
)


def out_of_memory_error(exc: BaseException, rank: int, step: int, device: Any,
                        advice: list[Any] | None) -> FatalTrainingError:
    """One sentence for a CUDA OOM on `rank` during `step`; the plan's changes that lower
    the run's memory (`advice`: `plan.relief`'s, or their dicts) as its remedy."""
    where = f"while loading the model on rank {rank}" if step <= 0 else \
        f"on rank {rank} at step {step}"
    used = ""
    try:
        import torch  # noqa: PLC0415

        if device is not None and getattr(device, "type", "") == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            used = f" ({(total - free) / (1 << 30):.1f} of {total / (1 << 30):.1f} GiB in use)"
    except Exception:  # the device may be unusable right after the failure
        used = ""
    planned = tuple(as_changes(advice))
    return FatalTrainingError("out_of_memory", f"Training ran out of GPU memory {where}{used}.",
                              None if planned else "A smaller batch or more GPUs also help.",
                              planned or OUT_OF_MEMORY_CHANGES)


@dataclass
class HostOutOfMemory:
    """A process of a run killed because this machine ran out of memory."""

    #: who killed it: "ray" (Ray's memory monitor) or "kernel" (the kernel's OOM killer)
    by: str
    pid: int | None = None
    #: Ray's name for what the process ran (e.g. "RayTrainWorker.__init__"); "" unknown
    task: str = ""
    #: what the process held when it was killed, and the machine's use and limit (bytes)
    held: int | None = None
    node_used: int | None = None
    node_limit: int | None = None


def kernel_oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has ended since boot (None: unknown)."""
    try:
        with open("/proc/vmstat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


_KERNEL_VICTIM = re.compile(rb"oom-kill:.*?\bpid=(\d+)|Killed process (\d+)")


def kernel_oom_victims() -> set[int] | None:
    """The pids the kernel's log says its OOM killer ended (None: the log cannot be read,
    as for most users; `kernel_oom_kills` then stands alone)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found: set[int] = set()
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # a record overwritten while reading: go on with the next
                continue
            for m in _KERNEL_VICTIM.finditer(record):
                found.add(int(m.group(1) or m.group(2)))
    finally:
        os.close(fd)
    return found


def host_out_of_memory(exc: BaseException | None,
                       kernel_kills_before: int | None = None) -> HostOutOfMemory | None:
    """The host out-of-memory kill that ended a run, from its failure: Ray's memory monitor
    names the process it killed; a process that died abruptly while the kernel's OOM
    kill count rose past `kernel_kills_before` (read on this machine when the run
    started) was the kernel's."""
    died: BaseException | None = None
    for e in _every_failure(exc):
        text = str(e)
        if RAY_OOM_TEXT in text:
            oom = HostOutOfMemory("ray")
            victim = _RAY_OOM_VICTIM.search(text)
            if victim:
                oom.task, oom.pid = victim.group(1).strip(), int(victim.group(2))
                if victim.group(3):
                    oom.held = int(float(victim.group(3)) * 1e9)
            node = _RAY_OOM_NODE.search(text)
            if node:
                oom.node_used, oom.node_limit = (int(float(x) * 1e9) for x in node.groups())
            return oom
        if died is None and type(e).__name__ == "ActorDiedError":
            died = e
    now = kernel_oom_kills()
    if died is None or kernel_kills_before is None or now is None or now <= kernel_kills_before:
        return None
    pid_text = re.search(r"\bpid: (\d+)", str(died))
    pid = int(pid_text.group(1)) if pid_text else None
    victims = kernel_oom_victims()
    if victims is not None and pid not in victims:
        return None  # the kernel killed another process, elsewhere on this machine
    name = re.search(r"\bclass_name: (\S+)", str(died))
    return HostOutOfMemory("kernel", pid, name.group(1) if name else "")


def process_words(oom: HostOutOfMemory, rank_pids: dict[int, int]) -> str:
    """The killed process in the app's words: a rank, or what the process was for."""
    for rank, pid in rank_pids.items():
        if oom.pid is not None and pid == oom.pid:
            return f"rank {rank}'s worker"
    kind = oom.task.split(".")[0]
    return PROCESS_NAMES.get(kind, f"a process of the run ({kind})" if kind
                             else "a process of the run")


def host_oom_words(oom: HostOutOfMemory, rank_pids: dict[int, int], plan: dict[str, Any],
                   checkpoint: str | None) -> str:
    """One sentence: which process ran out, the machine's state, what the plan expected,
    what to change, and the checkpoint that is kept."""
    who = process_words(oom, rank_pids)
    held = f", {oom.held / GIB:.1f} GiB" if oom.held else ""
    pid = f"pid {oom.pid}{held}" if oom.pid else ""
    by = "Ray's memory monitor" if oom.by == "ray" else "the system's out-of-memory killer"
    state = (f" with {oom.node_used / GIB:.1f} of {oom.node_limit / GIB:.1f} GiB in use"
             if oom.node_used and oom.node_limit else "")
    expected = ""
    if plan.get("per_worker"):
        expected = f", where the plan expected {plan['per_worker'] / GIB:.1f} GiB per worker"
        if plan.get("whole_run"):
            expected += f" and {plan['whole_run'] / GIB:.1f} GiB for the whole run"
    saved = (f" and resume from {checkpoint}, which is kept" if checkpoint
             else " and start again (no checkpoint had been saved)")
    return (f"Training ran out of memory on this machine: {by} stopped {who}"
            f"{f' ({pid})' if pid else ''}{state}{expected}; use fewer workers, a smaller "
            f"batch or LoRA adapters{' (or CPU offload on GPUs)' if plan.get('gpu') else ''}"
            f"{saved}.")
