"""A run that really runs out of host memory ends in the app's words (issue 45): which
process ran out, what the plan expected, what to change, and the last checkpoint, kept.

Two real ways a machine runs out, as users meet them:
- the kernel's OOM killer ends a training worker (SIGKILL): here rank 1 of a real tiny run
  is moved into a memory cgroup with a few MiB of room, so its next allocations really
  fail and the kernel kills it (needs a writable cgroup memory controller; skips
  elsewhere);
- Ray's memory monitor ends a process of the cluster when the machine's use passes its
  threshold (`RAY_memory_usage_threshold`): here a real actor grows past a threshold set
  just above what the machine uses, and the app reads Ray's own error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.memory_limit import memory_cgroup
from tests.helpers.runs import make_perturbed_run
from tests.helpers.voices import copy_voice

pytestmark = [pytest.mark.slow, pytest.mark.own_cluster]

GIB = 1 << 30


def _engine(*args: object) -> list[str]:
    return [sys.executable, "-m", "engine.cli.main", "--json", *map(str, args)]


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.timeout(1200)  # a Ray start on a loaded two-core machine is slow
def test_a_worker_the_kernel_kills_for_memory_ends_the_run_in_plain_words(
        coded_voice: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from engine.layout.checkpoints import latest_checkpoint

    cgroup = memory_cgroup()
    if cgroup is None:
        pytest.skip("no writable cgroup memory controller here (root on cgroup v1, or a "
                    "delegated cgroup v2 tree)")
    voice = copy_voice(coded_voice, tmp_path / "joe")
    train = ("train", voice, "--base", tiny_model_dir, "--cpu", "--workers", 2,
             "--batch-size", 2, "--run", "r1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # a run with a checkpoint to keep: the training area's own checkpoint of step 1, saved
    # in this process (a first Ray run only to make it cost a cluster start and a minute)
    run = make_perturbed_run(voice, tiny_model_dir, run="r1", steps=(1,), export=None)
    assert latest_checkpoint(run) is not None
    # resumed for many steps; rank 1 gets 16 MiB more than it holds when it starts
    log = tmp_path / "stderr.txt"
    proc = subprocess.Popen(_engine(*train, "--resume", "--steps", 200,
                                    "--checkpoint-every", 1000),
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)
    events: list[dict[str, Any]] = []
    killed = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            events.append(json.loads(line))
            e = events[-1]
            if e["event"] == "state" and e.get("state") == "worker_started" \
                    and e.get("rank") == 1 and killed is None:
                killed = int(e["pid"])
                cgroup.limit(16 << 20)
                cgroup.add(killed)
        rc = proc.wait(timeout=900)
    finally:
        proc.kill()
        cgroup.remove()
    assert killed is not None, "rank 1 never started"
    errors = [e for e in events if e["event"] == "error"]
    assert rc != 0 and errors, log.read_text()[-3000:]
    error = errors[-1]
    message, hint = error["message"], error["hint"] or ""
    kept = latest_checkpoint(run)
    assert kept is not None and kept.is_dir()  # nothing already saved is lost
    # one sentence: the process, what the plan expected, what to change, the checkpoint
    assert message.startswith("Training ran out of memory on this machine: the system's "
                              f"out-of-memory killer stopped rank 1's worker (pid {killed})"
                              ), message
    assert "where the plan expected" in message and "GiB per worker" in message
    assert "GiB for the whole run" in message
    assert "use fewer workers, a smaller batch or LoRA adapters" in message
    assert message.endswith(f"and resume from {kept.name}, which is kept.")
    assert message.count(". ") == 0  # one sentence
    assert "--resume" in hint and "Resume" in error["window_hint"]
    assert "--workers 1" in hint  # the plan's figures for each change
    for text in (message, hint):  # not Ray's text
        assert "docs.ray.io" not in text and "max_restarts" not in text
    # not retried: Ray Train would have started the group again into the same wall
    assert not [e for e in events if e["event"] == "state" and e.get("state") == "recovering"]


@pytest.mark.timeout(1200)  # a Ray start on a loaded two-core machine is slow
def test_ray_memory_monitor_kill_is_read_in_the_apps_words() -> None:
    """Ray's memory monitor kills a real actor that grows past the threshold; from Ray's
    own error the app reads which process it was, what it held and the machine's use."""
    import psutil

    vm = psutil.virtual_memory()
    threshold = (vm.total - vm.available + GIB) / vm.total
    script = """
import json, os, time
import ray
from engine.train.failures import host_oom_words, host_out_of_memory

ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)

@ray.remote(max_restarts=0)
class Grower:
    def pid(self):
        return os.getpid()

    def grow(self):
        held = []
        for _ in range(30):  # at most 3 GiB, 100 MiB at a time, every page touched
            block = bytearray(100 << 20)
            block[::4096] = bytes([1]) * (len(block) // 4096)
            held.append(block)
            time.sleep(0.2)
        time.sleep(10)  # held: the monitor looks every 100 ms
        return len(held)

g = Grower.remote()
pid = None
out = {"pid": pid, "error": None}
try:  # a machine already past the threshold kills it before it says its pid
    pid = ray.get(g.pid.remote())
    ray.get(g.grow.remote())
except Exception as exc:
    oom = host_out_of_memory(exc)
    pid = pid or (oom and oom.pid)
    out = {"pid": pid, "error": type(exc).__name__, "oom": oom and vars(oom),
           "words": oom and host_oom_words(oom, {0: pid}, {"per_worker": 2 << 30,
                                                          "whole_run": 7 << 30}, None)}
print(json.dumps(out))
ray.shutdown()
"""
    env = {**os.environ, "RAY_memory_usage_threshold": f"{threshold:.4f}",
           "RAY_memory_monitor_refresh_ms": "100", "RAY_AUTH_MODE": "disabled",
           "RAY_raylet_start_wait_time_s": "900"}  # a loaded machine starts slowly
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, env=env, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] == "OutOfMemoryError", "the actor grew 3 GiB past the threshold"
    oom = result["oom"]
    assert oom is not None and oom["by"] == "ray"
    assert oom["pid"] == result["pid"] and oom["task"].startswith("Grower.")
    assert oom["held"] > 0  # what it held when killed
    assert 0 < oom["node_used"] <= oom["node_limit"]
    words = result["words"]
    assert words.startswith("Training ran out of memory on this machine: Ray's memory "
                            f"monitor stopped rank 0's worker (pid {result['pid']}, ")
    assert "where the plan expected 2.0 GiB per worker and 7.0 GiB for the whole run" in words
    assert words.endswith("and start again (no checkpoint had been saved).")
    assert "docs.ray.io" not in words
