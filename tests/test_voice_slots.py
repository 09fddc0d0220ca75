"""Voices come and go on one warm base without its adapter pool growing (issue 30): a
voice deleted from the workspace is let go by its worker, one replaced (registered again
under its name, or exported again so its files change) is loaded over its old self, and
either way its adapter slot goes to the next voice; a request still rendering with the
old voice finishes with the old adapter (its slot is held until its last row ends).

Adapter voices here are the LoRA run's own adapter voice (A) and two of its variants (B:
its B halves negated, C: doubled), so the three speak differently on one tiny base.
"""

from __future__ import annotations

import io
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from engine.core.events import Event
from engine.model.adapter import AdapterRequest, export_adapter, load_adapter
from engine.synth.worker import SpeechWorker
from tests.helpers.serving import Server, start_server
from tests.helpers.voices import copy_voice

GREEDY = {"do_sample": False, "subtalker_do_sample": False, "seed": 0, "max_frames": 24,
          "loudness_lufs": None, "chunk_chars": 20}
#: a dozen chunks, three turns of four rows: the request outlasts the voice requests
#: sent after it by far
TEXT = " ".join(f"Voices come and go {i}." for i in range(12))
#: voices made one after another on one worker: more than its pool's slots
ROUNDS = 7


def _variant(folder: Path, out: Path, base_dir: Path, factor: float) -> Path:
    """Another adapter voice of the same base: `folder`'s B halves times `factor`."""
    voice = load_adapter(folder)
    tensors = {k: (v * factor if k.endswith(".lora_B") else v)
               for k, v in voice.tensors.items()}
    return export_adapter(AdapterRequest(
        tensors=tensors, base_dir=base_dir, base=voice.base, rank=int(voice.info["rank"]),
        alpha=float(voice.info["alpha"]), speaker=voice.speaker, x_vector=voice.x_vector,
        info={"run": f"times {factor:g}"}), out)


@pytest.fixture(scope="module")
def slots(lora_run: dict[str, Any], tiny_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A workspace whose voice `joe` has no export yet, and the three adapter voices
    (outside it) to put into its exports/ one by one."""
    root = tmp_path_factory.mktemp("slots")
    joe = copy_voice(lora_run["voice"], root / "ws" / "joe")
    own = joe / "exports" / "lora-adapter"
    a = Path(shutil.copytree(own, root / "made" / "A"))
    shutil.rmtree(joe / "exports")
    return {"ws": root / "ws", "joe": joe, "clip": next((joe / "prepared" / "clips").glob(
        "*.wav")), "A": a, "B": _variant(a, root / "made" / "B", tiny_model_dir, -1.0),
        "C": _variant(a, root / "made" / "C", tiny_model_dir, 2.0)}


class _Asker:
    """A real `SpeechWorker` in this process, asked one request at a time or several."""

    def __init__(self) -> None:
        self.ended: dict[str, tuple[threading.Event, dict[str, Any]]] = {}
        self.worker = SpeechWorker(self._sink, device="cpu", dtype="float32", rows=4).start()

    def _sink(self, event: Event) -> None:
        rid = str(event.data.get("request") or "")
        if event.kind in ("result", "error") and rid in self.ended:
            self.ended[rid][1].update(event.data, kind=event.kind)
            self.ended[rid][0].set()

    def submit(self, request: dict[str, Any]) -> str:
        self.ended[request["id"]] = (threading.Event(), {})
        self.worker.submit(request)
        return request["id"]

    def wait(self, rid: str) -> dict[str, Any]:
        done, answer = self.ended[rid]
        assert done.wait(300), rid
        assert answer["kind"] == "result", answer
        return answer

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.wait(self.submit(request))


def test_a_row_still_speaking_a_replaced_voice_finishes_with_its_old_adapter(
        slots: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    asker = _Asker()
    try:
        # the base alone (an x-vector voice, no adapter), then voice v = A beside it
        asker.ask({"op": "load", "id": "load", "voice": str(tiny_model_dir),
                   "reference": str(slots["clip"]), "x_vector_only": True})
        first = asker.ask({"op": "voice", "id": "v=A", "name": "v", "voice": str(slots["A"])})
        capacity = first["pool"]["adapter_slots"]
        assert capacity == 3 and first["pool"]["adapter_slots_used"] == 1

        def speak(rid: str) -> str:
            return asker.submit({"op": "speak", "id": rid, "text": TEXT, "voice": "v",
                                 "out": str(tmp_path / f"{rid}.wav"), "options": GREEDY})

        alone = asker.wait(speak("alone"))
        # v speaks A while it is replaced by B and another voice w (C) comes: w must not
        # take A's slot before that request's rows end
        rendering = speak("rendering")
        asker.submit({"op": "voice", "id": "v=B", "name": "v", "voice": str(slots["B"])})
        asker.ask({"op": "voice", "id": "w=C", "name": "w", "voice": str(slots["C"])})
        assert np.array_equal(sf.read(asker.wait(rendering)["path"])[0],
                              sf.read(alone["path"])[0])
        now = asker.wait(speak("now"))  # v is B now
        assert not np.array_equal(sf.read(now["path"])[0], sf.read(alone["path"])[0])
        # A's slot was freed when its last row ended: voices come and go in three slots
        gone = asker.ask({"op": "forget", "id": "forget w", "name": "w"})
        assert gone["removed"] and gone["pool"]["adapter_slots_used"] == 1
        for i in range(ROUNDS):
            made = asker.ask({"op": "voice", "id": f"x{i}", "name": f"x{i}",
                              "voice": str(slots["ABC"[i % 3]])})
            assert made["pool"]["adapter_slots"] == capacity
            asker.ask({"op": "forget", "id": f"forget x{i}", "name": f"x{i}"})
    finally:
        asker.worker.close(timeout=60, cancel=True)


def _clip(path: Path, pitch: float) -> Path:
    """A registrable clip (3-30 s) of its own pitch: one instant voice each."""
    rate, seconds = 24000, 4
    t = np.linspace(0, seconds, rate * seconds, endpoint=False)
    wave = np.sin(2 * np.pi * pitch * t) * (0.25 + 0.1 * np.sin(2 * np.pi * 2 * t))
    noise = np.random.default_rng(int(pitch)).normal(0, 0.01, len(t))
    sf.write(path, (wave + noise).astype(np.float32), rate)
    return path


def _put(source: Path, where: Path) -> None:
    """`source` as the export folder `where`, replacing it whole (as an export does)."""
    fresh = where.with_name(f".{where.name}.new")
    shutil.copytree(source, fresh)
    if where.exists():
        old = where.with_name(f".{where.name}.old")
        where.rename(old)
        fresh.rename(where)
        shutil.rmtree(old)
    else:
        fresh.rename(where)


def test_voices_come_and_go_on_the_server_and_its_pool_does_not_grow(
        slots: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real `serve`: adapter voices put into and removed from the workspace, one
    exported again over itself, and instant voices registered and deleted by a client,
    each more times than the pool has slots; one model, a pool of one size, and each
    voice answers as the same adapter did alone."""
    exports = slots["joe"] / "exports"
    exports.mkdir()
    srv = start_server(["--workspace", str(slots["ws"]), "--reference-base",
                        str(tiny_model_dir), "--port", "0", "--device", "cpu", "--dtype",
                        "float32", "--max-loaded", "1", "--rows", "4"], tmp_path)
    http = srv.http(None)
    try:
        def speak(name: str) -> bytes:
            r = http.post("/v1/audio/speech", json={
                "model": "tts-1", "voice": name, "input": "One model, many voices.",
                "response_format": "wav", "max_frames": 8, "seed": 3})
            assert r.status_code == 200, (name, r.text)
            return r.content

        loads: list[int] = []

        def pools(srv: Server) -> list[dict[str, int]]:
            """The base's worker's pool; the first asks how many models were loaded (the
            server preloads joe's run first), and no voice after it loads one more."""
            health = srv.health()
            loads.append(health["models_loaded"])
            assert health["workers"] == 1 and loads[-1] == loads[0], health
            return health["voice_pools"]

        # a voice that stays (the base's worker stays with it: one no served voice uses
        # any more is closed), then voices that come and go beside it
        _put(slots["A"], exports / "stays")
        alone = {"A": speak("joe/stays")}
        for i in range(ROUNDS):
            if i:
                shutil.rmtree(exports / f"v{i - 1}")
            _put(slots["ABC"[i % 3]], exports / f"v{i}")
            # the server's list follows the workspace within a second or so (it is kept
            # beside the rendering, not read again at every request)
            deadline = time.monotonic() + 30
            while True:
                listed = [v["id"] for v in http.get("/v1/audio/voices").json()["data"]]
                if (f"joe/v{i}" in listed and f"joe/v{i - 1}" not in listed) \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert f"joe/v{i}" in listed and f"joe/v{i - 1}" not in listed
            said = speak(f"joe/v{i}")
            assert alone.setdefault("ABC"[i % 3], said) == said, i
            if i == 0:
                capacity = pools(srv)[0]["adapter_slots"]
            assert pools(srv)[0]["adapter_slots"] == capacity, i
        assert len(set(alone.values())) == 3  # three adapters, three ways of speaking
        # exported again under its name (its files replaced): it speaks its new adapter
        last = exports / f"v{ROUNDS - 1}"
        other = "ABC"[ROUNDS % 3]
        _put(slots[other], last)
        assert speak(f"joe/{last.name}") == alone[other]
        # instant voices a client registers and deletes: the worker lets each go
        for j in range(ROUNDS):
            clip = _clip(tmp_path / f"guest{j}.wav", 120 + 15 * j)
            made = http.post("/v1/audio/voices", data={
                "name": f"guest{j}", "consent": "I agree to my voice being cloned.",
                "ref_text": "Hello there, this is my voice."},
                files={"audio_sample": (clip.name, clip.read_bytes(), "audio/wav")})
            assert made.status_code == 200, made.text
            assert sf.read(io.BytesIO(speak(f"guest{j}")))[1] == 24000
            assert http.delete(f"/v1/audio/voices/guest{j}").status_code == 200
        (pool,) = pools(srv)
        # the voices left on the worker: joe's two adapter voices (and no guest)
        assert pool["voices"] == 2, pool
        assert pool["adapter_slots"] == capacity and pool["adapter_slots_used"] <= 2, pool
    finally:
        http.close()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=60)
