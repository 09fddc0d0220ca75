"""Many voices of one base in one continuous batch (issue 30): each row carries its own
voice (its adapter slot and speaker row), and a row's output never depends on its company.

Voices here: two adapter voices of the LoRA run (its last step, and the same adapters with
B negated, so the two really differ), the adapter voice of the run with adapters on the
code predictor too (`lora_predictor_run`), the voice's instant voice (in-context) and the
base's zero-shot x-vector voice (no adapter), all on one loaded tiny base model.
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config.speak import SpeakOptions
from engine.core.errors import InputError, ModelError
from engine.core.events import Emitter
from engine.layout.tiers import run_adapter_dir
from engine.model import files
from engine.model.adapter import (
    AdapterRequest,
    export_adapter,
    load_adapter,
    weights_fingerprint,
)
from engine.model.loading import load_model
from engine.model.speaker_encoder import speaker_encoder_fingerprint
from engine.prepare.instant import make_instant_voice
from engine.synth.adapters import PROJECTIONS
from engine.synth.batcher import BatchRequest, ContinuousBatcher
from engine.synth.decoding import DecodeSettings, FastTalker
from engine.synth.rows import RowBatch
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import instant_source, resolve_source
from engine.train.export import export
from tests.helpers.host_syncs import SyncCounter
from tests.helpers.parity import ChoiceLog, assert_same_codes, record_choices
from tests.helpers.runs import LORA_STEPS
from tests.helpers.serving import start_server
from tests.helpers.voices import copy_voice

GREEDY = SpeakOptions(do_sample=False, subtalker_do_sample=False, seed=0, max_frames=24,
                      loudness_lufs=None)
TEXT = "Hello there, this is a test."


def negated_adapter(folder: Path, out: Path, base_dir: Path) -> Path:
    """Another adapter voice of the same base: `folder`'s adapters with B negated."""
    voice = load_adapter(folder)
    tensors = {k: (-v if k.endswith(".lora_B") else v) for k, v in voice.tensors.items()}
    return export_adapter(AdapterRequest(
        tensors=tensors, base_dir=base_dir, base=voice.base, rank=int(voice.info["rank"]),
        alpha=float(voice.info["alpha"]), speaker=voice.speaker, x_vector=voice.x_vector,
        info={"run": "negated"}), out)


@pytest.fixture(scope="module")
def voices(lora_run: dict[str, Any], lora_predictor_run: dict[str, Any], tiny_model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the LoRA run's voice with two adapter voices and an instant voice; the
    full (merged) export of the first adapter's step beside it; the predictor run's adapter
    voice (p1, the one the run wrote) and its full export (pfull)."""
    voice = copy_voice(lora_run["voice"], tmp_path_factory.mktemp("voices") / "joe")
    shutil.rmtree(voice / "exports", ignore_errors=True)
    one = Path(export(voice, voice / "exports" / "a1", run="lora", step=LORA_STEPS,
                      adapter=True)["out_dir"])
    two = negated_adapter(one, voice / "exports" / "a2", tiny_model_dir)
    make_instant_voice(voice, str(tiny_model_dir))
    clip = next((voice / "prepared" / "clips").glob("*.wav"))
    full = tmp_path_factory.mktemp("full") / "a1-full"  # beside no voice: served by none
    return {"voice": voice, "a1": one, "a2": two, "clip": clip,
            "full": Path(export(voice, full, run="lora", step=LORA_STEPS)["out_dir"]),
            "p1": run_adapter_dir(lora_predictor_run["voice"], "lorap"),
            "pfull": lora_predictor_run["export"]}


@pytest.fixture(scope="module")
def base_synth(voices: dict[str, Any], tiny_model_dir: Path) -> Synthesizer:
    """One tiny base model with the four voices loaded beside each other."""
    synth = Synthesizer.load(resolve_source(voices["a1"]), device="cpu", dtype="float32")
    synth.add_voice("a1", resolve_source(voices["a1"]))
    synth.add_voice("a2", resolve_source(voices["a2"]))
    synth.add_voice("p1", resolve_source(voices["p1"]))
    synth.add_voice("instant", instant_source(voices["voice"]))
    synth.add_voice("plain", resolve_source(tiny_model_dir, reference=voices["clip"],
                                            x_vector_only=True))
    return synth


def run_batch(synth: Synthesizer, voices: list[Any], rows: int, tmp: Path) -> list[torch.Tensor]:
    """Each voice's greedy codes of TEXT, all submitted at once to one batcher of `rows`
    rows (so they start on the same frame, in this order)."""
    requests, done = [], threading.Semaphore(0)
    errors: list[BaseException] = []

    def finished(_result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            errors.append(exc)
        done.release()

    batcher = ContinuousBatcher(synth, rows=rows)
    try:
        with batcher._cond:  # the loop admits them together, into rows 0, 1, ...
            for i, voice in enumerate(voices):
                request = BatchRequest(rid=f"v{i}", text=TEXT, out=str(tmp / f"v{i}.wav"),
                                       fmt="wav", options=GREEDY, emitter=Emitter(None),
                                       done=finished, voice=voice)
                batcher.submit(request)
                requests.append(request)
        for _ in voices:
            assert done.acquire(timeout=300)
    finally:
        batcher.close()
    assert not errors, errors
    return [r.codes[0] for r in requests]


@contextmanager
def recorded(monkeypatch: pytest.MonkeyPatch,
             forced: list[torch.Tensor] | None = None) -> Iterator[ChoiceLog]:
    """`record_choices`, the batcher's prefill choice included."""
    import engine.synth.batcher as batcher_module

    with record_choices(monkeypatch, forced) as log, monkeypatch.context() as m:
        m.setattr(batcher_module, "choose", log)
        yield log


@pytest.mark.parity
@pytest.mark.parametrize(("name", "full"), [("a1", "full"), ("p1", "pfull")])
def test_an_adapter_voice_alone_in_the_shared_batch_speaks_as_its_merged_export(
        name: str, full: str, voices: dict[str, Any], base_synth: Synthesizer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """a1 adapts the talker, p1 the code predictor too."""
    merged = Synthesizer.load(resolve_source(voices[full]), device="cpu", dtype="float32")
    want = run_batch(merged, [None], 1, tmp_path)[0]
    with recorded(monkeypatch) as log:
        got = run_batch(base_synth, [base_synth.voice(name)], 1, tmp_path)[0]
    assert len(want) >= 5
    assert base_synth.voice(name).adapter > 0  # unmerged: the base's weights are its own
    assert_same_codes(got, want, log, base_synth.fast.eos)


@pytest.mark.parity
def test_in_a_batch_of_five_voices_each_row_equals_that_voice_alone(
        base_synth: Synthesizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["a1", "a2", "p1", "instant", "plain"]
    first = len(names) - 1  # the choice log's index of frame 1's choices, less 1
    row_voices = [base_synth.voice(n) for n in names]
    alone: list[ChoiceLog] = []
    codes = []
    for voice in row_voices:
        with recorded(monkeypatch) as log:
            codes.append(run_batch(base_synth, [voice], 1, tmp_path)[0])
        alone.append(log)
    # five voices, five ways of speaking: the adapters and the prompt all matter
    for i in range(len(names)):
        for j in range(i):
            assert not torch.equal(codes[i], codes[j]), (names[i], names[j])
    # the batch, teacher-forced per choice to each row's own run alone: calls 0..4 are the
    # rows' prefills (one row each), then every frame's choices for all five rows
    forced = [log.own[0] for log in alone]
    longest = max(len(log.own) for log in alone)
    for k in range(1, longest):
        forced.append(torch.stack([log.own[k][0] if k < len(log.own) else torch.tensor(0)
                                   for log in alone]))
    with recorded(monkeypatch, forced) as batch:
        together = run_batch(base_synth, row_voices, len(names), tmp_path)
    for row, (log, name) in enumerate(zip(alone, names, strict=True)):
        assert torch.equal(together[row], codes[row]), name
        for k in range(len(log.own)):
            at = row if k == 0 else first + k
            mine, theirs = int(batch.own[at][0 if k == 0 else row]), int(log.own[k][0])
            if mine != theirs:
                assert batch.near_tie(at, 0 if k == 0 else row, mine, theirs, 1e-4), (
                    f"{name}: choice {k} is {mine} in the batch and {theirs} alone, and not "
                    "a near-tie")


def test_rows_without_predictor_adapters_keep_their_numbers_once_a_voice_adapts_it(
        voices: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    """A talker-only adapter row and a plain row, before and after an adapter voice of the
    code predictor joins the model (its pool then holds the predictor's layers, their
    slots zero for these rows): bit for bit the same codes, not merely a near-tie."""
    synth = Synthesizer.load(resolve_source(voices["a1"]), device="cpu", dtype="float32")
    synth.add_voice("a1", resolve_source(voices["a1"]))
    synth.add_voice("plain", resolve_source(tiny_model_dir, reference=voices["clip"],
                                            x_vector_only=True))
    rows = [synth.voice("a1"), synth.voice("plain")]
    pool = synth.fast.adapters.pool
    assert pool is not None and not pool.predictor
    before = run_batch(synth, rows, 2, tmp_path)
    synth.add_voice("p1", resolve_source(voices["p1"]))
    assert synth.fast.adapters.pool is not pool and synth.fast.adapters.pool.predictor
    after = run_batch(synth, rows, 2, tmp_path)
    for name, one, two in zip(["a1", "plain"], before, after, strict=True):
        assert len(one) >= 5 and torch.equal(one, two), name
    # and the batch does apply p1's predictor adapters: without them it speaks otherwise
    p1 = load_adapter(voices["p1"])
    talker_only = {k: v for k, v in p1.tensors.items() if ".code_predictor." not in k}
    assert len(talker_only) < len(p1.tensors)
    export_adapter(AdapterRequest(
        tensors=talker_only, base_dir=tiny_model_dir, base=p1.base, rank=int(p1.info["rank"]),
        alpha=float(p1.info["alpha"]), speaker=p1.speaker, x_vector=p1.x_vector,
        info={"run": "talker-only"}), tmp_path / "p1-talker")
    synth.add_voice("p1-talker", resolve_source(tmp_path / "p1-talker"))
    spoken = [run_batch(synth, [synth.voice(n)], 1, tmp_path)[0] for n in ("p1", "p1-talker")]
    assert not torch.equal(*spoken)


def test_a_row_that_takes_another_voice_speaks_with_that_voice_s_adapter(
        base_synth: Synthesizer, tmp_path: Path) -> None:
    # one batcher, one row: a1's request, then a2's into the same row of the same batch
    # (its rows' gathered adapters are kept between frames and must follow the new slot)
    alone = {n: run_batch(base_synth, [base_synth.voice(n)], 1, tmp_path)[0]
             for n in ("a1", "a2")}
    assert not torch.equal(alone["a1"], alone["a2"])
    batcher = ContinuousBatcher(base_synth, rows=1)
    got = []
    try:
        for i, name in enumerate(["a1", "a2", "a1"]):
            done = threading.Event()
            request = BatchRequest(rid=f"turn{i}", text=TEXT, out=str(tmp_path / f"t{i}.wav"),
                                   fmt="wav", options=GREEDY, emitter=Emitter(None),
                                   done=lambda _r, _e, d=done: d.set(),
                                   voice=base_synth.voice(name))
            batcher.submit(request)
            assert done.wait(timeout=300)
            got.append((name, request.codes[0]))
    finally:
        batcher.close()
    for name, codes in got:
        assert torch.equal(codes, alone[name]), name


def test_a_base_has_one_weights_fingerprint_whatever_of_it_was_worked_out_first(
        tiny_model_dir: Path) -> None:
    """The speaker encoder's fingerprint of the same file, worked out first in a process,
    once answered for the weights' (so an adapter voice made there refused its own base
    in every other process: the server's)."""
    files._memo.clear()
    speaker_encoder_fingerprint(tiny_model_dir)
    got = weights_fingerprint(tiny_model_dir)
    files._memo.clear()
    assert got == weights_fingerprint(tiny_model_dir)


def test_a_voice_of_another_kind_or_base_refuses_in_one_sentence(
        voices: dict[str, Any], base_synth: Synthesizer) -> None:
    with pytest.raises(InputError, match="checkpoint changes the base model"):
        base_synth.add_voice("run", resolve_source(voices["voice"] / "runs" / "lora"))
    with pytest.raises(InputError, match="not loaded here"):
        base_synth.voice("nobody")


class _Frame:
    """What the capture stand-in returns (CPU): replaying runs the recorded frame."""

    def __init__(self, frame: Any) -> None:
        self.run = frame

    def replay(self) -> None:
        self.run()


def test_voices_come_and_go_in_a_fixed_pool_and_only_its_growth_drops_the_graphs(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    official = load_model(tiny_model_dir, "cpu", torch.float32)
    fast = FastTalker(official.model)
    talker = official.model.talker
    stacks = {"model": talker.model.layers,
              "code_predictor.model": talker.code_predictor.model.layers}

    def adapter(seed: int, predictor: bool = False) -> dict[str, torch.Tensor]:
        g, out = torch.Generator().manual_seed(seed), {}
        for stack, layers in stacks.items():
            if stack != "model" and not predictor:
                continue
            for i, layer in enumerate(layers):
                for proj in PROJECTIONS:
                    rows, cols = layer.get_submodule(proj).weight.shape
                    key = f"talker.{stack}.layers.{i}.{proj}"
                    out[f"{key}.lora_A"] = torch.randn(2, cols, generator=g)
                    out[f"{key}.lora_B"] = torch.randn(rows, 2, generator=g)
        return out

    monkeypatch.setattr(RowBatch, "_record", lambda self, frame: _Frame(frame))
    pools = fast.adapters
    assert pools.add("a", adapter(0), 1.0, "a") == 1
    assert pools.add("b", adapter(1), 1.0, "b") == 2
    batch = fast.row_batch(2, 100, 20, 40, DecodeSettings(), 50)
    batch.key_valid[:, 0] = True
    batch.adapter[:] = torch.tensor([1, 2])
    for _ in range(2):
        batch.run(64, graphs=True)  # warm-up, then captured
    assert batch.capture_attempts == 1
    with torch.inference_mode(), SyncCounter() as syncs:
        batch.frame(64)  # the frame with each row's adapter: still nothing read back
    assert not syncs.hits, syncs.hits
    held = [t.data_ptr() for t in pools.pool.a[0]]
    # voices come and go in the pool's free slots: the same tensors, the graph replays
    assert pools.add("c", adapter(2), 1.0, "c") == 3
    pools.release(2)
    assert pools.add("d", adapter(3), 1.0, "d") == 2
    assert pools.add("a", adapter(0), 1.0, "a") == 1  # loaded already: its slot
    assert [t.data_ptr() for t in pools.pool.a[0]] == held
    batch.run(64, graphs=True)
    assert batch.capture_attempts == 1
    # one more than it holds: a larger pool, every slot kept, the graphs captured again
    before = pools.pool.b[0][1][3].clone()  # layer 0, k: slot 3 (c)
    assert pools.add("e", adapter(4), 1.0, "e") == 4
    assert torch.equal(pools.pool.b[0][1][3], before)
    assert not pools.pool.a[0][0][0].any()  # slot 0 stays the base alone
    for _ in range(2):
        batch.run(64, graphs=True)
    assert batch.capture_attempts == 2
    # a voice that adapts the code predictor: the pool is made anew with its layers (the
    # talker's slots kept, theirs zero), captured again, and its frame reads nothing back
    n = len(stacks["model"])
    assert pools.add("p", adapter(5, predictor=True), 1.0, "p") == 5
    assert pools.pool.predictor and torch.equal(pools.pool.b[0][1][3], before)
    assert not pools.pool.a[n][0][:5].any()  # no voice before it adapts the predictor
    batch.adapter[:] = torch.tensor([5, 1])
    for _ in range(2):
        batch.run(64, graphs=True)
    assert batch.capture_attempts == 3
    with torch.inference_mode(), SyncCounter() as syncs:
        batch.frame(64)
    assert not syncs.hits, syncs.hits
    with pytest.raises(ModelError, match="voices sharing one base cannot apply"):
        pools.add("x", {"talker.codec_head.weight": torch.zeros(1)}, 1.0, "x")


def test_adapter_and_instant_voices_of_one_base_share_one_model_in_the_server(
        voices: dict[str, Any], tmp_path: Path) -> None:
    """The real `serve` with `--max-loaded 1`: two adapter voices and the instant voice of
    one base, asked at once, are one model in memory, and each answers in its own voice
    (as it answers alone)."""
    names = ["joe/a1", "joe/a2", "joe/instant"]
    srv = start_server(["--workspace", str(voices["voice"].parent), "--port", "0",
                        "--device", "cpu", "--dtype", "float32", "--max-loaded", "1",
                        "--rows", "4"], tmp_path)
    try:
        def speak(name: str) -> bytes:
            with srv.http(None) as http:
                r = http.post("/v1/audio/speech", json={
                    "model": "tts-1", "voice": name, "input": "One model, many voices.",
                    "response_format": "wav", "max_frames": 8, "seed": 3})
                assert r.status_code == 200, (name, r.text)
                return r.content

        with ThreadPoolExecutor(len(names)) as pool:
            together = dict(zip(names, pool.map(speak, names), strict=True))
        health = srv.health()
        assert health["models_loaded"] == 1 and health["workers"] == 1, health
        assert len(set(together.values())) == len(names)  # three voices, three renders
        for name in names:
            assert speak(name) == together[name], name
        assert srv.health()["models_loaded"] == 1
    finally:
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=60)
