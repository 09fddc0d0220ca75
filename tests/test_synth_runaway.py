"""The runaway guard (issue 33): a render whose codes loop or stay silent ends early with
its reason, through every way of speaking (eager, the fixed-shape frame loop, the
continuous batcher, streaming, `speak`, the server's header); a normal render's codes
are the same bit for bit with the guard on and off.

The tiny model is forced into a drone or into silence by its own weights (a copy whose
talker always prefers one codebook-0 code, exported as a voice): the real decoder runs,
nothing is mocked. Its codec encodes silence as one code (`Synthesizer.silence`)."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch

from engine import api
from engine.cli.main import main
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError
from engine.core.events import Emitter, Event
from engine.model.export import export_custom_voice
from engine.synth.batcher import BatchRequest, ContinuousBatcher
from engine.synth.runaway import (
    FRAME_RATE,
    LOOP,
    MAX_PERIOD,
    SILENCE,
    RunawayGuard,
    RunawayWatch,
    stop_reason,
)
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from tests.helpers.serving import KEY, Server, start_server
from tests.helpers.voices import DRONE, forced_export

TEXT = "The kettle started to whistle just as the phone rang in the hall."
#: the guard off: the renders the guard must leave as they are
OFF = {"runaway_loop_s": 0.0, "runaway_silence_s": 0.0}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[dict[str, Path], dict[str, Synthesizer]]:
    """The drone, the silent and a plain voice of the tiny model, exported and loaded."""
    root = tmp_path_factory.mktemp("runaway")
    paths = {"loop": forced_export(tiny_model_dir, root / "drone", DRONE)}
    synths = {"loop": Synthesizer.load(resolve_source(paths["loop"]), device="cpu",
                                       dtype="float32")}
    # the code the tiny codec gives silence, as the guard of a loaded voice knows it
    paths["silence"] = forced_export(tiny_model_dir, root / "hush", synths["loop"].silence[0])
    vector = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    paths["plain"] = export_custom_voice(tiny_model_dir, {}, "Ada", vector, root / "plain",
                                         keep_dtype=False)
    for name in ("silence", "plain"):
        synths[name] = Synthesizer.load(resolve_source(paths[name]), device="cpu",
                                        dtype="float32")
    return paths, synths


@pytest.fixture(scope="module")
def voices(loaded: tuple[dict[str, Path], dict[str, Synthesizer]]) -> dict[str, Path]:
    return loaded[0]


@pytest.fixture(scope="module")
def synths(loaded: tuple[dict[str, Path], dict[str, Synthesizer]]) -> dict[str, Synthesizer]:
    return loaded[1]


# -- the rule ------------------------------------------------------------------------------

def _watched(codes: np.ndarray, guard: RunawayGuard) -> tuple[str | None, int | None]:
    watch = RunawayWatch.of(guard, 1)
    assert watch is not None
    watch.feed(codes[None], len(codes))
    return watch.reason[0], watch.cut[0]


def test_the_rule_catches_loops_of_every_period_and_silence_never_speech() -> None:
    rng = np.random.default_rng(0)
    guard = RunawayGuard.of(4.0, 5.0, [7])
    assert guard is not None and (guard.loop_frames, guard.silence_frames) == (50, 63)
    speech = rng.integers(8, 2048, 600)
    assert _watched(speech, guard) == (None, None)
    # pauses shorter than the limit (two 3 s silences) and a held code for 2 s: speech
    paused = np.concatenate([speech[:40], np.full(38, 7), speech[40:80], np.full(38, 7),
                             np.full(25, 99), speech[80:200]])
    assert _watched(paused, guard) == (None, None)
    for period in (1, 2, 7, MAX_PERIOD):
        phrase = rng.integers(8, 2048, period)
        looped = np.tile(phrase, 400 // period)
        # sampling varies a loop: one frame in ten is something else
        looped[rng.random(len(looped)) < 0.1] = rng.integers(8, 2048)
        codes = np.concatenate([speech[:30], looped])
        reason, cut = _watched(codes, guard)
        assert reason == LOOP, period
        # a deviation breaks two repeats (its own and the one a period later)
        assert cut is not None and 30 + period + 40 <= cut <= 30 + period + 2 * 50
        # a function of the codes alone: the kept frames trip on their last one, one
        # frame fewer does not
        assert stop_reason(codes[:cut], guard) == LOOP
        assert stop_reason(codes[:cut - 1], guard) is None
    # silence with a breath in it; a repeated silent code is silence, never a loop
    hush = np.full(80, 7)
    hush[30] = 1234
    reason, cut = _watched(np.concatenate([speech[:20], hush]), guard)
    assert reason == SILENCE and cut == 20 + 57 + 1
    # each rule can be off; both off: no guard at all
    assert _watched(np.concatenate([speech[:20], hush, hush]),
                    RunawayGuard(50, 0, (7,)))[0] is None
    assert RunawayGuard.of(0, 0, [7]) is None


def test_limits_are_checked_in_the_speak_options() -> None:
    with pytest.raises(InputError, match="runaway_loop_s must be at least 0 and at most 60"):
        SpeakOptions(runaway_loop_s=61)
    with pytest.raises(InputError, match="runaway_silence_s"):
        SpeakOptions(runaway_silence_s=-1)


# -- the real decoder ----------------------------------------------------------------------

def test_the_tiny_codec_encodes_silence_as_codes_the_guard_knows(
        synths: dict[str, Synthesizer]) -> None:
    plain = synths["plain"]
    assert plain.silence and DRONE not in plain.silence
    settings = plain.decode_settings(SpeakOptions())
    assert settings.guard is not None and settings.guard.silence_codes == plain.silence
    assert plain.decode_settings(SpeakOptions(**OFF)).guard is None


@pytest.mark.parametrize("kind", ["loop", "silence"])
def test_a_forced_render_ends_early_with_its_reason_on_every_path(
        kind: str, synths: dict[str, Synthesizer], tmp_path: Path) -> None:
    synth = synths[kind]
    events: list[Event] = []
    opts = SpeakOptions(seed=3, loudness_lufs=None, max_frames=80)
    result = synth.speak_to_file(TEXT, tmp_path / "cut.wav", opts, on_event=events.append)
    chunk = result["chunks"][0]
    assert chunk["runaway"] == kind and result["runaway"] == [kind]
    assert not chunk["capped"] and chunk["frames"] < chunk["max_frames"]
    assert chunk["frames"] < (5.0 + 1) * FRAME_RATE
    assert sf.info(tmp_path / "cut.wav").frames > 0  # the audio up to the cut is there
    warned = [e for e in events if e.kind == "log" and e.data.get("runaway") == kind]
    assert len(warned) == 1 and "cut there" in warned[0].data["message"]
    assert "--" not in warned[0].data["message"]  # the log reads in any surface (issue 50)
    eager = synth.speak(TEXT, opts).codes[0]
    assert len(eager) == chunk["frames"]
    # what the evaluation renders through (every sentence of a set at once)
    assert [s.chunks[0]["runaway"] for s in synth.speak_many([TEXT, TEXT], opts)] == [kind] * 2
    # the guard off: the same render runs to its cap
    whole = synth.speak(TEXT, opts.replace(**OFF))
    assert whole.chunks[0]["capped"] and whole.chunks[0]["runaway"] is None
    assert torch.equal(whole.codes[0][:len(eager)], eager)

    # the fixed-shape loop (what CUDA captures) cuts at the same frame
    settings = synth.decode_settings(opts)
    prefill = _prefill(synth, opts)
    static = synth.fast.generate(prefill, [chunk["max_frames"]], settings, seeds=[3],
                                 static=True)[0]
    assert torch.equal(static, eager)
    # as on a GPU, where the end-of-speech check (and so the guard) reads every 8 frames:
    # the cut is found later, and made at the same frame
    sparse = dataclasses.replace(settings, sync_every=8)
    for fixed in (True, False):
        late = synth.fast.generate(prefill, [chunk["max_frames"]], sparse, seeds=[3],
                                   static=fixed)[0]
        assert torch.equal(late, eager), fixed
    # streaming: the same frames reach the sink, the same reason is reported
    streamed = synth.speak_stream(TEXT, _Sink(), opts)
    assert streamed.chunks[0]["runaway"] == kind
    assert torch.equal(streamed.codes[0], eager)
    # the continuous batcher, beside a normal request of the same options
    got = _batched(synth, [("cut", TEXT, opts)], tmp_path)
    assert got["cut"]["runaway"] == [kind]
    assert got["cut"]["chunks"][0]["runaway"] == kind
    assert got["cut"]["chunks"][0]["frames"] == len(eager)


def test_a_normal_render_is_the_same_bit_for_bit_with_the_guard_on(
        synths: dict[str, Synthesizer], tmp_path: Path) -> None:
    synth = synths["plain"]
    for seed in (0, 1):
        on = SpeakOptions(seed=seed, loudness_lufs=None, chunk_chars=40, max_frames=40)
        guarded = synth.speak(TEXT, on)
        bare = synth.speak(TEXT, on.replace(**OFF))
        assert all(c["runaway"] is None for c in guarded.chunks)
        assert len(guarded.codes) == len(bare.codes)
        assert all(torch.equal(a, b) for a, b in zip(guarded.codes, bare.codes, strict=True))
        assert np.array_equal(guarded.audio, bare.audio)
    on = SpeakOptions(seed=2, loudness_lufs=None, max_frames=40)
    settings, bare_settings = synth.decode_settings(on), synth.decode_settings(on.replace(**OFF))
    prefill = _prefill(synth, on)
    cap = [40]
    a = synth.fast.generate(prefill, cap, settings, seeds=[2], static=True)[0]
    b = synth.fast.generate(prefill, cap, bare_settings, seeds=[2], static=True)[0]
    assert torch.equal(a, b)
    got = _batched(synth, [("on", TEXT, on), ("off", TEXT, on.replace(**OFF))], tmp_path)
    assert got["on"]["runaway"] == [] and got["on"]["chunks"] == got["off"]["chunks"]
    on_audio, _ = sf.read(got["on"]["path"])
    off_audio, _ = sf.read(got["off"]["path"])
    assert np.array_equal(on_audio, off_audio)


def test_cli_and_api_speak_report_the_cut(voices: dict[str, Path], tmp_path: Path,
                                          tiny_model_dir: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "loop.wav"
    # the limit is a flag from the speak options: off, it runs to its cap (human output)
    assert main(["speak", str(voices["loop"]), TEXT, "-o", str(out), "--seed", "1",
                 "--runaway-loop-s", "0", "--max-frames", "60"]) == 0
    said = capfd.readouterr().out
    assert said.startswith(f"Wrote {out}") and "runaway" not in said
    assert sf.info(out).frames == 60 * 1920
    # the Python API's result says it too. It loads with the CPU's own dtype (bf16 where
    # the CPU has native bf16 math), whose codec may give silence another code than
    # float32's (seen: 618 against 243 on a CPU with AMX): the silent voice drones on the
    # code silence has in the dtype that speaks it
    auto = Synthesizer.load(resolve_source(voices["loop"]), device="cpu")
    hush = forced_export(tiny_model_dir, tmp_path / "hush-auto", auto.silence[0])
    cut = api.speak(hush, TEXT, tmp_path / "api.wav", device="cpu", seed=1)
    assert cut["runaway"] == ["silence"] and cut["chunks"][0]["runaway"] == "silence"
    # --json last: it keeps this process's standard output for its events
    assert main(["--json", "speak", str(voices["loop"]), TEXT, "-o", str(out),
                 "--seed", "1"]) == 0
    lines = [json.loads(x) for x in capfd.readouterr().out.splitlines()]
    result = lines[-1]
    assert result["event"] == "result" and result["runaway"] == ["loop"]
    assert result["chunks"][0]["runaway"] == "loop"
    assert "1 chunk(s) cut by the runaway guard (loop)" in result["summary"]


@pytest.fixture(scope="module")
def server(voices: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("runaway_serve")
    (root / "key").write_text(KEY + "\n")
    srv = start_server([str(voices["loop"]), str(voices["silence"]), str(voices["plain"]),
                        "--port", "0", "--api-key-file", str(root / "key"), "--device", "cpu",
                        "--dtype", "float32", "--max-loaded", "3"], root)
    yield srv
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=60) in (0, 130)


@pytest.mark.parametrize("voice,cut,cap", [("drone", "loop", 100), ("hush", "silence", 100),
                                           ("plain", None, 20)])
def test_the_server_answers_the_audio_up_to_the_cut_and_says_why(
        server: Server, voice: str, cut: str | None, cap: int) -> None:
    with server.http() as http:
        before = len(server.logged())
        reply = http.post("/v1/audio/speech", json={"input": TEXT, "voice": voice,
                                                    "response_format": "wav", "seed": 2,
                                                    "max_frames": cap})
        assert reply.status_code == 200, reply.text
        assert reply.headers.get("x-voxshard-cut") == cut
        audio, rate = sf.read(_bytes(reply.content))
        if cut is not None:
            assert 0 < len(audio) / rate < 6.0
            logged = server.logged_since(before)[-1]
            assert logged["runaway"] == [cut]
        # streamed as server-sent events: the headers left first, the last event says it
        events = http.post("/v1/audio/speech", json={"input": TEXT, "voice": voice,
                                                     "response_format": "pcm", "seed": 2,
                                                     "max_frames": cap,
                                                     "stream_format": "sse"})
        done = json.loads(events.text.strip().split("\n\n")[-1].removeprefix("data: "))
        assert done["type"] == "speech.audio.done" and done.get("runaway") == (
            [cut] if cut else None)
        if cut is not None:  # and the request log, which the streamed headers could not
            assert server.logged_since(before, 2)[-1]["runaway"] == [cut]


# -- helpers ---------------------------------------------------------------------------------

class _Sink:
    def __init__(self) -> None:
        self.samples = 0

    def write(self, audio: np.ndarray) -> None:
        self.samples += audio.size


def _bytes(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


def _prefill(synth: Synthesizer, opts: SpeakOptions) -> Any:
    from engine.synth.prompt import build_prefill

    return build_prefill(synth.model, synth.processor, [TEXT], synth.speaker_vector,
                         synth._language_id(opts.language), synth._non_streaming(opts),
                         icl=synth.icl)


def _batched(synth: Synthesizer, asks: list[tuple[str, str, SpeakOptions]],
             tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Each request's result from one continuous batch."""
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []
    done = threading.Semaphore(0)
    batcher = ContinuousBatcher(synth, rows=2)
    try:
        for rid, text, opts in asks:
            def finished(result: Any, exc: BaseException | None, rid: str = rid) -> None:
                if exc is not None:
                    errors.append(exc)
                else:
                    results[rid] = result
                done.release()

            batcher.submit(BatchRequest(rid=rid, text=text, out=str(tmp_path / f"{rid}.wav"),
                                        fmt="wav", options=opts, emitter=Emitter(None),
                                        done=finished))
        for _ in asks:
            assert done.acquire(timeout=240)
    finally:
        batcher.close()
    assert not errors, errors
    return results
