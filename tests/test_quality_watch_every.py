"""Every checkpoint a run writes is measured or noted, and every voice a server lists
speaks (issue 45), on one real run of the tiny model.

The voice is prepared before any base model is chosen (its instant voice records none),
then trained on the tiny base: 5 steps, a checkpoint every step, keep 2 (training prunes
all but the newest two; five is more than the watcher holds at once, `HELD_MAX`), watched
by `evaluate --watch` in a second process started the moment the run folder appears, as
the window starts it. Then the workspace is served and every voice the server lists over
HTTP is spoken with the official `openai` client.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf

from engine.layout.run import Run
from engine.layout.tiers import read_instant
from engine.prepare.instant import make_instant_voice
from engine.train.driver import train
from tests.helpers.ray_cluster import SharedCluster
from tests.helpers.serving import ENGINE, KEY, ROOT, Server, start_server
from tests.helpers.voices import copy_voice

STEPS = 5
SHORT = {"max_frames": 12, "seed": 3}


@pytest.fixture(scope="module")
def watched(prepared_voice: Path, tiny_model_dir: Path, shared_cluster: SharedCluster,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workspace = tmp_path_factory.mktemp("watch_every") / "ws"
    voice = copy_voice(prepared_voice, workspace / "joe")
    make_instant_voice(voice)  # prepared with no base chosen yet: it records none
    run_dir = voice / "runs" / "w5"
    shared_cluster.up()
    trained: dict[str, Any] = {}

    def run_training() -> None:
        try:
            trained["result"] = train(voice, str(tiny_model_dir), steps=STEPS,
                                      checkpoint_every=1, keep_checkpoints=2, workers=1,
                                      use_gpu=False, run="w5")
        except BaseException as exc:  # handed to the test below
            trained["error"] = exc

    thread = threading.Thread(target=run_training, name="train-w5")
    thread.start()
    deadline = time.monotonic() + 600
    while not run_dir.is_dir() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run_dir.is_dir(), trained
    watcher = subprocess.Popen(
        [*ENGINE, "--json", "evaluate", str(voice), "--run", "w5", "--watch", "--interval",
         "1", "--idle", "15", "--asr", "pocketsphinx", "--device", "cpu", "--no-export",
         "--max-frames", "10", "--sentences", "Please call me back this afternoon."],
        cwd=workspace.parent, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    thread.join()
    try:
        out, err = watcher.communicate(timeout=1200)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert "error" not in trained, trained
    assert watcher.returncode == 0, err[-3000:]
    return {"voice": voice, "run": run_dir, "workspace": workspace,
            "events": [json.loads(line) for line in out.splitlines() if line.startswith("{")]}


def test_every_checkpoint_of_the_run_is_measured_or_noted(watched: dict[str, Any]) -> None:
    run = Run(watched["run"])
    assert sorted(run.written().values()) == list(range(1, STEPS + 1))  # training's record
    data = run.evaluation()
    assert data is not None
    measured = {e["step"] for e in data["entries"] if e["kind"] == "checkpoint"}
    skipped = {n["step"]: n["reason"] for n in data["skipped"]}
    assert measured | set(skipped) == set(range(1, STEPS + 1)), (measured, skipped)
    assert not measured & set(skipped) and all(skipped.values())
    assert data["count"] == {"measured": len(measured), "written": STEPS,
                             "skipped": len(skipped)}
    # the best is a folder on disk (the kept copy), not a held copy that went away
    best = Path(data["best"]["checkpoint"])
    assert best.is_dir() and best.parent.name == "best" and (best / "COMPLETE").is_file()
    assert run.best() is not None
    assert not (watched["run"] / "held").exists() or not any((watched["run"] / "held").iterdir())
    result = watched["events"][-1]
    assert result["event"] == "result"
    assert f"{len(measured)} of {STEPS} checkpoints measured" in result["summary"]


def test_training_records_its_base_in_an_instant_voice_that_had_none(
        watched: dict[str, Any], tiny_model_dir: Path) -> None:
    instant = read_instant(watched["voice"])
    assert instant is not None and instant.base == str(tiny_model_dir)


@pytest.fixture(scope="module")
def server(watched: dict[str, Any]) -> Iterator[Server]:
    root = watched["workspace"].parent
    (root / "key").write_text(KEY + "\n")
    srv = start_server(["--workspace", str(watched["workspace"]), "--port", "0",
                        "--api-key-file", str(root / "key"), "--device", "cpu",
                        "--dtype", "float32", "--timeout", "300"], root)
    yield srv
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=60) in (0, 130)


def test_every_voice_the_server_lists_speaks(server: Server) -> None:
    with server.http() as http:
        listed = [v["id"] for v in http.get("/v1/audio/voices").json()["data"]]
    assert {"joe", "joe/instant", "joe/w5"} <= set(listed), listed
    for name in listed:
        response = server.client().audio.speech.create(
            model="tts-1", voice=name, input="Hello there.", response_format="wav",
            extra_body=SHORT)
        audio, rate = sf.read(io.BytesIO(response.content))
        assert rate == 24000 and len(audio) > 0, name
