"""bench/gpu_proof.py on a machine without a GPU: one line, exit 0, and no Ray at import;
both proofs without the kit: one line, exit 2;
its time budget, and rows that reach the output folder as each configuration ends, past
a crashed configuration and a killed proof.

The GPU machine may have no Ray, so the module must import without it; the
whole `--tiny` run (every configuration, Ray-free and Ray, several minutes on 2 cores)
is a bench command (bench/device_rehearsal.sh); the suite runs one configuration of the
training proof and the speech proof where `ray` cannot be imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.no_ray import without_ray_env

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_proof_without_a_gpu_says_so_in_one_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the proof itself runs (bench/gpu_proof.py)")
    code = ("import sys; import bench.gpu_proof as g; "
            "assert 'ray' not in sys.modules, 'gpu_proof imports ray at import'; "
            "sys.exit(g.main([]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_proof: no NVIDIA GPU visible"), lines
    assert "ray" not in out.stderr.lower()


def test_gpu_proof_on_a_bare_python_names_what_is_missing_in_one_line() -> None:
    """Without site-packages (python -S: only the standard library, as bare as a machine
    gets) the proof stops before any work with one line naming the missing modules."""
    code = "import sys; import bench.gpu_proof as g; sys.exit(g.main(['--tiny']))"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu_proof: missing torch (torch;"), lines[0]
    for name in ("transformers", "librosa", "soundfile", "qwen_tts", "bench/device_kit.sh"):
        assert name in lines[0], name
    assert "Traceback" not in out.stderr, out.stderr[-2000:]


def test_speech_proof_without_the_kit_says_what_to_do_in_one_sentence() -> None:
    """The speech proof checks the kit before anything else, as the training proof does
    (it died with a traceback on a machine without qwen_tts and transformers 4.57)."""
    out = subprocess.run([sys.executable, "-S", "-m", "bench.gpu_speech_proof", "--sizes", "0.6b"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_speech_proof: missing torch"), lines
    for name in ("qwen_tts", "pyloudnorm", "bench/device_kit.sh"):
        assert name in lines[0], name
    assert lines[0].endswith(".") and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_model_flops_counts_the_step() -> None:
    """The MFU numerator: forward + input gradients + weight gradients (+ attention)."""
    import tempfile

    from bench.proof_figures import model_flops
    from engine.model.tiny import make_tiny_model

    tiny = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    full = model_flops(tiny, 4, 2.0, "talker")
    lora = model_flops(tiny, 4, 2.0, "lora")
    # LoRA skips the base weights' gradients: two thirds of the matmul work remain
    assert 0.6 * full < lora < 0.72 * full
    # twice the clips, twice the work
    assert model_flops(tiny, 8, 2.0, "talker") == pytest.approx(2 * full, rel=1e-9)


def test_budget_starts_a_configuration_only_when_its_estimate_fits() -> None:
    from bench.proof_rows import Budget

    now = [0.0]
    budget = Budget(100.0, start=0.0, clock=lambda: now[0])
    assert budget.may_start("0.6b", "plain")  # nothing measured: any time left will do
    now[0] = 40.0
    budget.record("0.6b", "plain", 40.0)
    assert budget.may_start("0.6b", "lora")  # 60 s left, ~40 s needed
    now[0] = 70.0
    budget.record("0.6b", "lora", 30.0)
    assert budget.estimate("0.6b", "offload") == 35.0  # the median at this size
    assert not budget.may_start("0.6b", "offload")  # 30 s left
    # a larger size: the same configuration scaled by the weights
    budget.weights.update({"0.6b": 1.0, "1.7b": 3.0})
    assert budget.estimate("1.7b", "plain") == 120.0
    assert budget.deadline == 100.0
    assert Budget(0, start=0.0).deadline is None and Budget(0, start=0.0).may_start("x", "y")


def test_a_spent_budget_starts_nothing_and_says_so_in_the_rows(tmp_path: Path,
                                                                capsys: Any) -> None:
    from bench.gpu_proof import main
    from bench.proof_rows import ROWS_FILE
    from engine.core.jsonl import read_jsonl

    rc = main(["--tiny", "--no-ray", "--budget-s", "0.001", "--configs", "plain,lora",
               "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")])
    assert rc == 0, capsys.readouterr().out
    rows = read_jsonl(tmp_path / "out" / ROWS_FILE)
    # the reinforce stage's row after the size's configurations: not started either
    assert [(r["config"], r["skipped"]) for r in rows] == [
        ("plain", "the time budget is spent"), ("lora", "the time budget is spent"),
        ("reinforce", "the time budget is spent")]
    assert not (tmp_path / "cache").exists()  # not even the model was made
    assert "not started: the time budget is spent" in capsys.readouterr().out


def _spawned(pid: int) -> list[Any]:
    """The running processes multiprocessing spawned under `pid` (ones exiting are left out)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # gone, or a zombie not reaped yet: an earlier configuration's
            continue
    return found


@pytest.mark.slow
def test_rows_reach_the_out_folder_as_they_finish_and_a_crash_keeps_them(
        tmp_path: Path) -> None:
    """plain, then a configuration whose rank 1 raises in its second step, then one that
    never ends: while that one runs, the folder already holds plain's row and the crash's
    one-line failure (the proof went on after the crash); the proof is then killed as a
    device command is at its time limit, and the rows stay."""
    import os
    import signal
    import time

    import psutil

    from bench.proof_rows import ROWS_FILE, TABLE_FILE
    from engine.core.jsonl import read_jsonl

    out = tmp_path / "out"
    added = {"crash": "tests.helpers.builders:crashing_proof_builder",
             "hang": "tests.helpers.builders:hanging_proof_builder"}
    # run as a file, as a person may (bench/_root.py puts the tree on the path)
    cmd = [sys.executable, "bench/gpu_proof.py", "--tiny", "--no-ray", "--steps", "2",
           "--budget-s", "0", "--configs", "plain,crash,hang", "--out", str(out),
           "--cache", str(tmp_path / "cache")]
    for name, builder in added.items():
        cmd += ["--add-config", f'{name}={{"builder": "{builder}"}}']
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        give_up = time.monotonic() + 900  # a guard against a hang, not a speed limit
        ranks: list[psutil.Process] = []
        while proc.poll() is None and (len(read_jsonl(out / ROWS_FILE)) < 2 or len(ranks) < 2):
            assert time.monotonic() < give_up, "the proof wrote no rows"
            time.sleep(1.0)
            ranks = _spawned(proc.pid)  # the configuration after the crash: its two ranks
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        rows = read_jsonl(out / ROWS_FILE)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        text = proc.communicate()[0]
    assert [r["config"] for r in rows] == ["plain", "crash"], text[-3000:]
    assert rows[0]["final_loss"] > 0 and "error" not in rows[0]
    assert rows[1]["error"] == "rank 1 raised RuntimeError: rank 1 crashed in its second step"
    lines = (out / TABLE_FILE).read_text().splitlines()
    assert lines[2].startswith("tiny  plain") and "failed: rank 1 raised" in lines[3]
    assert read_jsonl(out / ROWS_FILE) == rows  # still there after the kill
    psutil.wait_procs(ranks, timeout=30)
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_training_processes_keep_sockets_on_loopback_and_number_gpus_as_nvml(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's workers (engine.train.launch) and the proof's children get one environment:
    gloo's and NCCL's sockets on loopback for a local run (NCCL's was left unset: it
    picked an interface of its own), a user's interface kept, and CUDA numbering GPUs by
    PCI bus as NVML and engine.train.gpus do."""
    from engine.train.process_env import process_env

    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    assert process_env(local=True) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                       "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth1")
    assert process_env(local=True)["NCCL_SOCKET_IFNAME"] == "eth1"
    # an existing cluster: its workers must reach each other over the network
    assert process_env(local=False) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_reinforce_row_times_rollouts_and_the_update_on_the_tiny_model(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """The reinforce stage's figures (issue 33) as the first GPU run will take them, here on
    the CPU with a voice of the tiny model and a small plan: the stage's own loop, timed."""
    import numpy as np

    from bench.proof_reinforce import reinforce_figures
    from bench.proof_rows import table_line
    from engine.model.export import export_custom_voice

    vector = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    voice = export_custom_voice(tiny_model_dir, {}, "Ada", vector, tmp_path / "voice")
    plan = {"texts": 1, "group": 2, "max_frames": 8, "iterations": 1, "updates": 2}
    row = reinforce_figures(voice, "cpu", plan)
    assert row["renders_per_iteration"] == 2 and row["updates"] == 2
    assert row["rollout_renders_per_s"] > 0 and 0 < row["frames_per_render"] <= 8
    assert row["update_step_s"] > 0 and row["update_s"] == pytest.approx(
        2 * row["update_step_s"], abs=2e-3)
    assert len(row["reward"]) == len(row["kl"]) == 2  # the warm-up and the measured one
    line = table_line({"config": "reinforce", "gpus": 1, "size": "tiny", **row})
    assert "renders/s" in line and "update step" in line


def _proof_without_ray(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = without_ray_env(tmp_path)
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


def test_training_proof_reaches_its_table_where_ray_cannot_be_imported(tmp_path: Path) -> None:
    """The lent GPU machine may have no Ray: the Ray-free path (torch.distributed's own
    processes, the product's worker loop and checkpointer) must run to its row there, and
    only the Ray row may say Ray is missing. A module of the worker's path that loads Ray
    at import fails here, not on the loan."""
    out = _proof_without_ray(tmp_path, [
        "-m", "bench.gpu_proof", "--tiny", "--configs", "plain", "--steps", "4", "--no-reinforce",
        "--cache", str(tmp_path / "cache"), "--json", str(tmp_path / "proof.json")])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    rows = {r["config"]: r for r in json.loads((tmp_path / "proof.json").read_text())["rows"]}
    plain = rows["plain"]
    assert "error" not in plain, plain
    assert plain["resume_equal"] is True and plain["resumed_steps"], plain
    assert plain["final_loss"] > 0 and plain["gpus"] == 2
    assert rows["plain via Ray"]["error"] == "Ray is not installed (ray)", rows


def test_speech_proof_reaches_its_table_where_ray_cannot_be_imported(tmp_path: Path) -> None:
    out = _proof_without_ray(tmp_path, [
        "-m", "bench.gpu_speech_proof", "--tiny", "--frames", "12",
        "--json", str(tmp_path / "speech.json")])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    (row,) = json.loads((tmp_path / "speech.json").read_text())
    assert "error" not in row, row
    assert row["first_audio_s"] > 0 and row["worker_8_rows_audio_s_per_s"] > 0, row


def test_a_trimmed_wheel_installs_without_what_it_dropped(tmp_path: Path) -> None:
    """bench/trim_wheel.py (how the kit's Ray fits a device call): the dropped folders are
    gone, a native program is stripped and still runs, and pip installs the result with
    the hashes its rewritten RECORD gives."""
    import base64
    import hashlib
    import shutil
    import zipfile

    from bench.trim_wheel import trim

    def record(name: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        return f"{name},sha256={digest.decode()},{len(data)}"

    program = Path(shutil.which("true") or "/bin/true").read_bytes()
    files = {"demo/__init__.py": b"VALUE = 7\n", "demo/jars/big.jar": b"x" * 100_000,
             "demo/bin/true": program,
             "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
             "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                         b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            # a regular file's mode, as wheels store it (pip keeps the x bits of those)
            info.external_attr = (0o100755 if name.endswith("true") else 0o100644) << 16
            z.writestr(info, data)
        z.writestr("demo-1.0.dist-info/RECORD", "\n".join(
            [record(n, d) for n, d in files.items()] + ["demo-1.0.dist-info/RECORD,,"]))
    before, after = trim(wheel, ["demo/jars/"])
    assert after < before
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert "demo/jars/big.jar" not in names and "demo/__init__.py" in names
        stripped = z.read("demo/bin/true")
        lines = z.read("demo-1.0.dist-info/RECORD").decode().splitlines()
    assert record("demo/bin/true", stripped) in lines
    assert not any("big.jar" in line for line in lines)
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                           "--no-deps", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (site / "demo" / "jars").exists()
    assert subprocess.run([str(site / "demo" / "bin" / "true")]).returncode == 0
    out = subprocess.run([sys.executable, "-c", "import demo; print(demo.VALUE)"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(site)})
    assert out.stdout.strip() == "7", out.stderr
