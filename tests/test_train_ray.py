"""End to end on a real local Ray cluster: 2 CPU workers (gloo), FSDP2, the tiny model,
real speech (piper), real processes killed with SIGKILL and SIGTERM.

Kept to two `fit()` calls (each costs ~20-30 s on 2 cores):
1. API (one run in a module fixture, checked by several tests): trains (loss goes
   down), live metrics from both ranks within a second, checkpoints (keeps the last
   2), a worker killed with kill -9 mid-run makes Ray restart the group from the last
   checkpoint and the replayed steps give bit-identical losses (exact resume), the run
   finishes, no Ray process is left.
2. CLI `--json`: metric events stream on stdout; SIGTERM saves a complete
   checkpoint and exits 130 with nothing left running.
Covered elsewhere, not run again here: `--resume` of a run stopped with SIGTERM (the
window journey stops and resumes through the CLI; the README walkthrough resumes from
the CLI), and an export of a 2-worker run speaking like the official
`generate_custom_voice` (tests/test_synth_checkpoint.py, on the session's trained run).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.core.events import Event
from tests.helpers.processes import session_processes
from tests.helpers.voices import copy_voice

# these runs start their own clusters: kill -9 recovery and "nothing left running" are theirs
pytestmark = [pytest.mark.slow, pytest.mark.own_cluster]

ROOT = Path(__file__).resolve().parent.parent


def _listening(pids: set[int]) -> list[str]:
    """"addr:port" of every listening TCP socket of these processes (as `ss -ltnp` lists)."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        out += [f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE}


class _KillMidRun:
    """The run's events, the workers' pids as they start, what they listen on at step 3,
    and a real SIGKILL of rank 1's process once it reports step 6."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.pids: dict[int, int] = {}
        self.killed: dict[str, float] = {}
        self.listening: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, ev: Event) -> None:
        if os.environ.get("VOXSHARD_TEST_VERBOSE") and ev.kind in ("state", "log", "error"):
            print(f"{ev.time % 1000:8.2f} {ev.kind} {ev.data}", flush=True)
        with self.lock:
            self.events.append(ev)
            d = ev.data
            if ev.kind == "state" and d.get("state") == "worker_started":
                self.pids[int(d["rank"])] = int(d["pid"])
            if (ev.kind == "metric" and d.get("rank") == 0 and d["values"].get("step") == 3
                    and not self.listening):
                # what the training workers listen on while they train (ss -ltn's view)
                self.listening.extend(_listening(set(self.pids.values())))
            if (ev.kind == "metric" and d.get("rank") == 1 and d["values"].get("step") == 6
                    and not self.killed):
                os.kill(self.pids[1], signal.SIGKILL)
                self.killed["t"] = time.time()

    def rank0_train(self) -> list[tuple[int, float, float]]:
        """(step, loss, time) of rank 0's training metrics, in order."""
        return [(e.data["values"]["step"], e.data["values"]["loss/train"], e.time)
                for e in self.train_metrics() if e.data["rank"] == 0]

    def train_metrics(self) -> list[Event]:
        return [e for e in self.events if e.kind == "metric" and e.data["split"] == "train"]


@pytest.fixture(scope="module")
def failover(prepared_voice: Path, tiny_model_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-worker run of 12 steps whose rank 1 is killed with kill -9 at step 6, and the
    processes of this test process it left behind."""
    from engine.train.driver import train

    voice = copy_voice(prepared_voice, tmp_path_factory.mktemp("failover") / "voice")
    before = _children()
    listener = _KillMidRun()
    t0 = time.time()
    result = train(voice, str(tiny_model_dir), workers=2, steps=12, checkpoint_every=4,
                   val_every=6, keep_checkpoints=2, lr=2e-3, max_failures=1,
                   on_event=listener)
    return {"result": result, "run": listener, "wall": time.time() - t0,
            "left": _children() - before}


def test_a_killed_worker_restarts_the_group_and_the_replay_is_exact(
        failover: dict[str, Any]) -> None:
    run, result = failover["run"], failover["result"]
    assert run.killed, "the run ended before the worker could be killed"
    assert result["steps"] == 12 and not result["stopped"]
    assert result["restarts"] == 1
    rank0 = run.rank0_train()
    steps = [s for s, _, _ in rank0]
    # steps 5 and 6 ran before the kill and again after the restart from step 4
    assert steps.count(5) == 2 and steps.count(6) == 2, steps
    first_pass = {s: loss for s, loss, _ in rank0[: steps.index(6) + 1]}
    second_pass = {s: loss for s, loss, _ in rank0[steps.index(6) + 1:]}
    for s in (5, 6):
        assert first_pass[s] == second_pass[s], f"step {s} replayed differently"
    assert sorted(second_pass) == list(range(5, 13))
    # it learns: the last steps' loss is clearly below the first steps'
    losses = [second_pass.get(s, first_pass.get(s)) for s in range(1, 13)]
    assert statistics.mean(losses[-3:]) < statistics.mean(losses[:3]) - 0.05, losses
    # recovery: from the kill to the first metric of the new worker group
    recovered = min(t for s, _, t in rank0 if t > run.killed["t"] and s == 5)  # the replay
    latency = [e.time - e.data["sent"] for e in run.train_metrics()]
    # how fast metrics reach the driver is printed (bench_train measures it), not asserted
    print(f"\nmetric latency median {statistics.median(latency) * 1000:.0f} ms; "
          f"failover: first metric {recovered - run.killed['t']:.1f} s after kill -9; "
          f"fit()->first metric {result['launch_to_first_metric_s']:.1f} s; cluster start->"
          f"first metric {result['start_to_first_metric_s']:.1f} s; wall "
          f"{failover['wall']:.1f} s")


def test_the_workers_listen_on_loopback_only(failover: dict[str, Any]) -> None:
    """Local means local: no rendezvous store on every interface, gloo on loopback."""
    listening = failover["run"].listening
    assert listening, "the workers listened on nothing (gloo pairs should be there)"
    assert all(a.startswith(("127.0.0.1:", "::1:", "::ffff:127.0.0.1:")) for a in listening), \
        listening


def test_both_ranks_report_training_validation_and_memory(failover: dict[str, Any]) -> None:
    run = failover["run"]
    metrics = run.train_metrics()
    assert {e.data["rank"] for e in metrics} == {0, 1}
    mem = metrics[0].data["values"]
    assert mem["memory/rss_gib"] > 0 and "memory/state_gib" in mem
    val = [e.data["values"]["loss/val"] for e in run.events
           if e.kind == "metric" and e.data["split"] == "val"]
    assert val, "no validation loss was reported"
    run_dir = Path(failover["result"]["run"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {x["rank"] for x in lines if x["kind"] == "train"} == {0, 1}
    assert json.loads((run_dir / "config.json").read_text())["parallel"]["workers"] == 2


def test_the_newest_two_checkpoints_are_kept_whole(failover: dict[str, Any]) -> None:
    run_dir = Path(failover["result"]["run"])
    ckpts = sorted(p.name for p in run_dir.glob("checkpoint_step_*"))
    assert ckpts == ["checkpoint_step_0000008", "checkpoint_step_0000012"], ckpts
    assert all((run_dir / c / "COMPLETE").exists() for c in ckpts)


def test_nothing_of_the_run_is_left(failover: dict[str, Any]) -> None:
    """Ray is gone: nothing this test process started is still running, nor are the
    rendezvous files of the two worker groups (the killed one's included)."""
    from engine.core.storage import checkpoint_root
    from engine.train.pgroup import store_prefix

    assert failover["left"] == set()
    assert not glob.glob(store_prefix(str(checkpoint_root(failover["result"]["run"]))) + "*")


def _read_events(proc: subprocess.Popen[str], until: Any, timeout: float) -> list[dict]:
    """JSON events from the CLI's stdout until `until(events)` or the process ends."""
    assert proc.stdout is not None
    events: list[dict] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        events.append(json.loads(line))
        if until(events):
            break
    return events


def test_cli_json_streams_metrics_and_sigterm_saves(prepared_voice: Path, tiny_model_dir: Path,
                                                   tmp_path: Path) -> None:
    voice = copy_voice(prepared_voice, tmp_path / "voice")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "engine.cli.main", "--json", "train", str(voice),
           "--base", str(tiny_model_dir), "--workers", "2", "--steps", "400",
           "--checkpoint-every", "1000", "--val-every", "0", "--run", "cli"]
    # its own session, as the GUI starts the engine: every process it starts is findable
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    try:
        def two_steps(evs: list[dict]) -> bool:
            return sum(1 for e in evs if e["event"] == "metric" and e.get("rank") == 0) >= 2

        events = _read_events(proc, two_steps, timeout=240)
        assert two_steps(events), (events[-5:], proc.stderr.read() if proc.poll() else "")
        proc.send_signal(signal.SIGTERM)
        events += _read_events(proc, lambda evs: False, timeout=120)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 130, proc.stderr.read() if proc.stderr else rc
    metric = next(e for e in events if e["event"] == "metric" and e.get("rank") == 0)
    for key in ("loss/train", "loss/talker", "loss/subtalker", "lr", "grad/norm",
                "perf/step_s", "perf/tokens_per_s", "memory/rss_gib", "step"):
        assert key in metric["values"], key
    saved = [e for e in events if e["event"] == "state" and e.get("state") == "checkpoint"]
    assert saved and saved[-1]["step"] >= 2
    assert events[-1]["event"] == "error" and events[-1]["code"] == "cancelled"
    stop_step = saved[-1]["step"]
    run_dir = voice / "runs" / "cli"
    assert (run_dir / f"checkpoint_step_{stop_step:07d}" / "COMPLETE").exists()
    time.sleep(1.0)
    assert session_processes(proc.pid) == [], "processes of the cancelled run are left"


def test_out_of_memory_in_a_ray_worker_ends_the_run_without_retries(tmp_path: Path) -> None:
    """A real torch.OutOfMemoryError raised in one Ray Train worker: one sentence, no restart."""
    from engine.cluster import connect
    from engine.config.change import Change
    from engine.config.train import TrainConfig
    from engine.core.errors import TrainingError
    from engine.core.events import Emitter
    from engine.train.launch import Launch, LaunchSpec

    gpus = Change("parallel.workers", 2, "Use 2 GPUs")
    before = _children()
    states: list[str] = []
    cfg = TrainConfig().replace(parallel={"workers": 2}, data={"batch_size": 2})
    cluster = connect(None, num_cpus=2)
    try:
        spec = LaunchSpec(config=cfg.to_dict(), run_dir=tmp_path / "runs" / "oom", total_steps=5,
                          workers=2, use_gpu=False, max_failures=2,
                          builder="tests.helpers.builders:oom_builder",
                          extra={"oom_rank": 1, "oom_advice": [gpus]})
        launch = Launch(spec, Emitter(lambda ev: states.append(str(ev.data.get("state")))))
        with pytest.raises(TrainingError) as err:
            launch.start().wait()
    finally:
        cluster.close()
    assert err.value.message == "Training ran out of GPU memory on rank 1 at step 1."
    assert err.value.changes == (gpus,)
    assert err.value.hint == "Use 2 GPUs (workers=2)."
    # max_failures=2 would have restarted the group twice: it started once
    assert states.count("worker_started") == 2 and "recovering" not in states
    assert _children() - before == set()
