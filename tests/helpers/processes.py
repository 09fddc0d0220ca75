"""Processes in tests: a fake engine, and what is still running.

- `flood_program`: the command line of a process speaking the engine's event protocol
  (metrics, fast), with the engine's own writer; given a run folder, it appends its
  records to that run's metrics.jsonl as the engine's metrics pump does.
- `pid_alive`: whether a process runs (a zombie does not).
- `session_processes`: every live process of a session (a process started with
  `start_new_session=True` leads one: all it started is found by its pid).
- `python_threads`: the names of this process's Python threads.
- `stopped_at_first_metric`: an engine command with `--json`, sent SIGTERM (the window's
  Stop) at its first metric event of a split; its exit code and every event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil

from engine.core.process import alive


def flood_program(count: int, forever: bool = False, child: bool = False,  # noqa: PLR0913
                  rate: float = 0.0, ranks: int = 2, stop_s: float = 0.0,
                  stop_fails: bool = False, gpu: bool = False,
                  run: str | None = None, build_s: float = 0.0,
                  first_step: int = 0) -> list[str]:
    """A process speaking the engine's event protocol with the engine's own writer.

    It streams `count` metric events, `rate` per second (0: as fast as it
    can), or forever until SIGTERM, then a result; events cycle through `ranks`
    workers (step = event index, as the page keys points by step); `child` also
    starts a grandchild process in the same group, to prove a cancel reaches it.
    On SIGTERM it stops as training does: state `stopping`, then rank 0's last word
    (state `stopped`, "step N": the workers saved), then `stop_s` seconds of shutting
    the cluster down, then it exits as cancelled; with `stop_fails` the save fails
    instead. `gpu` adds the memory figures a GPU worker reports (device used and total,
    80 GiB devices); `run` names the run folder in the first state event, and each
    metric is appended to its metrics.jsonl (the first of each rank, a start's, carries
    `build_s` as the model's build time); steps count from `first_step` (a resume's).
    A `worker_node` state says where each rank runs, as the engine's workers do.
    """
    code = f"""
import json, os, signal, socket, subprocess, sys, time
from engine.cli.output import JsonOutput
from engine.core.events import Emitter
out = JsonOutput(sys.stdout)
em = Emitter(out.handle)
if {child!r}:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    em.log("grandchild %d" % p.pid)
stop = []
def term(*_):
    stop.append(True)  # handled in the loop: a write here could re-enter one in progress
def finish_stop(step):
    em.state("stopping", detail="saving a checkpoint")
    if {stop_fails!r}:
        time.sleep({stop_s!r})
        out.error("training", "Saving the final checkpoint failed: no space left on device.",
                  "Free some space; checkpoint_step_0000004 is intact.")
        sys.exit(1)
    em.state("stopped", detail="step %d" % step)  # rank 0, after the save
    time.sleep({stop_s!r})  # the cluster shuts down
    out.error("cancelled", "Training stopped at step %d; saved a checkpoint." % step, None)
    sys.exit(130)
signal.signal(signal.SIGTERM, term)
em.state("training", **({{"run": {run!r}}} if {run!r} else {{}}))
for r in range({ranks!r}):
    em.state("worker_node", detail="rank %d on %s" % (r, socket.gethostname()))
metrics = open(os.path.join({run!r}, "metrics.jsonl"), "a", buffering=1) if {run!r} else None
t0 = time.monotonic()
i = 0
while {forever!r} or i < {count}:
    step = {first_step!r} + i
    if stop:
        finish_stop(step - 1)
    values = {{"step": step, "loss/train": 5.0 / (1 + i * 1e-3), "lr": 2e-6,
               "perf/tokens_per_s": 1000.0 + i % 7, "memory/rss_gib": 1.0 + (i % 5) * 0.01}}
    if {gpu!r}:
        rank = i % {ranks!r}
        values.update({{"memory/device_used_gib": 20.0 + 5 * rank + (i % 11) * 0.1,
                       "memory/allocated_gib": 15.0 + 5 * rank, "memory/total_gib": 80.0}})
    if i < {ranks!r}:  # each rank's first record of this start
        values.update({{"perf/build_s": {build_s!r}, "perf/step_s": 0.0}})
    if metrics is not None:
        metrics.write(json.dumps({{"kind": "train", "rank": i % {ranks!r},
                                   "time": round(time.time(), 3), **values}}) + "\\n")
    em.metric(values, rank=i % {ranks!r}, split="train")
    if i % 100 == 0:
        em.progress("train", i, {count})
    i += 1
    if {forever!r}:
        time.sleep(0.001)
    elif {rate!r} and i % 20 == 0:
        # paced in bursts of 20, like ranks reporting together
        time.sleep(max(0.0, t0 + i / {rate!r} - time.monotonic()))
out.result({{"steps": i, "summary": "done"}})
"""
    return [sys.executable, "-c", code, "flood"]


pid_alive = alive  # the engine's: a zombie waiting to be reaped is not running


def python_threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def stopped_at_first_metric(cmd: list[str], split: str, cwd: Path | None = None,
                            timeout: float = 300) -> tuple[int, list[dict[str, Any]]]:
    """Run `cmd` (an engine command with --json), SIGTERM it at its first `metric` event
    of `split`; (its exit code, every event it wrote)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    events: list[dict[str, Any]] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            events.append(json.loads(line))
            if events[-1]["event"] == "metric" and events[-1].get("split") == split:
                proc.send_signal(signal.SIGTERM)
                break
        events += [json.loads(line) for line in proc.stdout]
        return proc.wait(timeout=timeout), events
    finally:
        proc.kill()
