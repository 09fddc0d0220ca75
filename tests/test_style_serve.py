"""Styles from a recorded take to a served request, on the tiny model.

Takes saved as Record saves them (piper speech, a style prompt's take with its style),
prepared, a run of one checkpoint with the data record training writes (`make_perturbed_run`
and `record_data`: training on Ray recording its styles is test_style_run's), then `serve`
on the workspace: the official
`openai` client's `instructions` with a trained style changes the audio (same seed) and
the answer says it was applied; a `wyoming` client asking with the style as its speaker
gets audio and the request log shows the style applied. An instruction for a voice
trained without styles is spoken with a warning, alike over HTTP (a header and the log)
and Wyoming (the log: the protocol has no place for it).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from engine.layout.manifest import read_manifest
from engine.layout.prompts import list_prompt_sets
from engine.layout.voice import create_voice
from engine.prepare.pipeline import prepare
from engine.prepare.styles import RECORDED
from engine.serve.app import INSTRUCTIONS_HEADER
from engine.train.rundata import record_data
from tests.helpers.runs import make_perturbed_run
from tests.helpers.serving import KEY, Server, start_server
from tests.helpers.voices import make_workspace

TEXT = "Hello there."
#: the extensions that keep a render cheap and repeatable
CHEAP = {"seed": 3, "max_frames": 8}
WARNING = "little or no effect"


def _record(voice: Any, synth: Callable[[str], tuple[np.ndarray, int]]) -> list[str]:
    """Six plain takes and two of each of two style prompts, saved as Record keeps a
    take (its prompt's id, and a style prompt's style); returns the styles recorded."""
    prompts = next(ps for ps in list_prompt_sets() if ps.language == "english").prompts
    plain = [p for p in prompts if not p.style][:6]
    styles = list(dict.fromkeys(p.style for p in prompts if p.style))[:2]
    styled = [p for s in styles for p in [q for q in prompts if q.style == s][:2]]
    for prompt in plain + styled:
        audio, rate = synth(prompt.text)
        voice.add_take((0.6 * audio).astype(np.float32), prompt.text, sample_rate=rate,
                       prompt_id=prompt.id,
                       extra={"style": prompt.style} if prompt.style else None)
    return styles


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, piper_synth: Callable[[str], tuple[np.ndarray, int]],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("style_serve")
    ws = make_workspace(root, tiny_model_dir)  # `ada`: an export trained without styles
    voice = create_voice(ws / "joe", "Joe", "english")
    styles = _record(voice, piper_synth)
    prepare(voice)
    rows = read_manifest(voice.path)
    assert {r["style"] for r in rows if r.get("style_source") == RECORDED} == set(styles)
    record_data(make_perturbed_run(voice.path, tiny_model_dir, run="s1", steps=(1,),
                                   export=None), voice.path)
    (root / "key").write_text(KEY + "\n")
    server = start_server(["--workspace", str(ws), "--port", "0", "--api-key-file",
                           str(root / "key"), "--device", "cpu", "--dtype", "float32",
                           "--timeout", "120", "--wyoming", "tcp://127.0.0.1:0"], root)
    yield {"server": server, "styles": styles}
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) in (0, 130)


def _speak(server: Server, voice: str, **extra: Any) -> tuple[bytes, dict[str, str],
                                                                 dict[str, Any]]:
    """The audio, headers and request-log record of one `audio.speech.create`."""
    before = len(server.logged())
    raw = server.client().audio.speech.with_raw_response.create(
        model="gpt-4o-mini-tts", voice=voice, input=TEXT, response_format="wav",
        extra_body=CHEAP, **extra)
    [logged] = server.logged_since(before)
    return raw.content, dict(raw.headers), logged


def _wyoming(server: Server, voice: str, speaker: str | None) -> tuple[bytes, dict[str, Any]]:
    """The audio and request-log record of a one-shot `synthesize` with a speaker."""
    host, port = str(server.serving["wyoming"]).removeprefix("tcp://").rsplit(":", 1)
    before = len(server.logged())

    async def ask() -> list[Event]:
        async with AsyncTcpClient(host, int(port)) as client:
            await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(
                name=voice, speaker=speaker)).event())
            events = []
            while not events or events[-1].type not in (AudioStop().event().type, "error"):
                event = await asyncio.wait_for(client.read_event(), 300)
                assert event is not None, "the server hung up"
                events.append(event)
            return events

    events = asyncio.run(ask())
    assert not any(Error.is_type(e.type) for e in events), events[-1].data
    audio = b"".join(AudioChunk.from_event(e).audio for e in events
                     if AudioChunk.is_type(e.type))
    [logged] = server.logged_since(before)
    return audio, logged


async def _speakers(server: Server) -> dict[str, list[str]]:
    host, port = str(server.serving["wyoming"]).removeprefix("tcp://").rsplit(":", 1)
    async with AsyncTcpClient(host, int(port)) as client:
        await client.write_event(Describe().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 60)
            assert event is not None
            if Info.is_type(event.type):
                voices = Info.from_event(event).tts[0].voices
                return {v.name: [s.name for s in v.speakers or []] for v in voices}


def test_a_recorded_style_is_spoken_over_openai_and_wyoming(served: dict[str, Any]) -> None:
    server, style = served["server"], served["styles"][0]
    plain, plain_headers, plain_log = _speak(server, "joe")
    styled, headers, logged = _speak(server, "joe", instructions=style)
    assert len(styled) > 44 and len(plain) > 44 and styled != plain
    assert headers[INSTRUCTIONS_HEADER.lower()] == "applied"
    assert INSTRUCTIONS_HEADER.lower() not in plain_headers and "instructions" not in plain_log
    assert logged["instructions"] == {"text": style, "applied": True, "notes": []}
    # the same request again is the same audio: the instruction, not the sampling, moved it
    assert _speak(server, "joe", instructions=style)[0] == styled

    # its speakers: the recorded styles, beside any prepare measured ("Speak quickly.")
    assert set(served["styles"]) <= set(asyncio.run(_speakers(server))["joe"])
    audio, heard = _wyoming(server, "joe", style)
    assert len(audio) > 0 and heard["status"] == 200 and heard["method"] == "WYOMING"
    assert heard["instructions"] == logged["instructions"]


def test_an_instruction_for_a_voice_without_styles_warns_alike_over_http_and_wyoming(
        served: dict[str, Any]) -> None:
    server, style = served["server"], served["styles"][0]
    _audio, headers, logged = _speak(server, "ada", instructions=style)
    said = headers[INSTRUCTIONS_HEADER.lower()]
    assert said.startswith("applied; ") and WARNING in said, said
    assert logged["instructions"]["text"] == style and logged["instructions"]["applied"]
    assert any(WARNING in n for n in logged["instructions"]["notes"])
    warned = [e for e in server.events if e.get("request_log") == logged]
    assert warned and warned[0]["level"] == "warning" and WARNING in warned[0]["message"]
    audio, heard = _wyoming(server, "ada", style)
    assert len(audio) > 0 and heard["instructions"] == logged["instructions"]


def test_each_trained_style_is_a_voice_home_assistant_can_pick(served: dict[str, Any]) -> None:
    # no Home Assistant offers a picker for a voice's speakers: each style is a voice too,
    # which a pipeline can pick, listed after the voice's plain name (its default)
    server, style = served["server"], served["styles"][0]
    listed = [name for name, _ in server.serving["wyoming_voices"]]
    assert f"joe ({style})" in asyncio.run(_speakers(server))
    assert f"joe ({style})" in listed and listed.index("joe") < listed.index(f"joe ({style})")
    audio, heard = _wyoming(server, f"joe ({style})", None)
    assert len(audio) > 0 and heard["status"] == 200 and heard["voice"] == "joe"
    assert heard["instructions"] == {"text": style, "applied": True, "notes": []}
