"""Which voice Home Assistant gets (issue 50), through the `wyoming` package's own client
against the real server on the tiny model: a voice's plain name follows its best tier as it
changes while the server runs, and each language's first pick is a voice recorded in it."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from wyoming.audio import AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from engine.layout.voice import create_voice
from engine.model.export import export_custom_voice
from engine.prepare.instant import make_instant_voice
from engine.serve.wyoming import reply_sentences
from tests.helpers.serving import Server, serve_workspace
from tests.helpers.voices import copy_voice


def _export(model_dir: Path, voice: Path, name: str, speaker: str) -> None:
    hidden = json.loads((model_dir / "config.json").read_text())["talker_config"]["hidden_size"]
    vector = np.random.default_rng(0).standard_normal(hidden).astype(np.float32)
    export_custom_voice(model_dir, {}, speaker, vector, voice / "exports" / name,
                        keep_dtype=False)


@pytest.fixture(scope="module")
def workspace(tiny_model_dir: Path, prepared_voice: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ha_voices") / "ws"
    ws.mkdir()
    # ada: English, prepared, its instant voice only (no training yet)
    ada = copy_voice(prepared_voice, ws / "ada")
    make_instant_voice(ada, str(tiny_model_dir))
    # bob: prepared with no base chosen, so his instant voice records none; the window's
    # Listen page speaks him on its Base field, the server on its --reference-base
    make_instant_voice(copy_voice(prepared_voice, ws / "bob"))
    # bert: German, fine-tuned
    bert = create_voice(ws / "bert", "Bert", "german").path
    _export(tiny_model_dir, bert, "bert-v1", "Bert")
    return ws


@pytest.fixture(scope="module")
def server(workspace: Path, tiny_model_dir: Path) -> Iterator[Server]:
    srv = serve_workspace(workspace, "--timeout", "120", "--reference-base",
                          str(tiny_model_dir))
    yield srv
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=60) in (0, 130)


def _client(server: Server) -> AsyncTcpClient:
    host, port = str(server.serving["wyoming"]).removeprefix("tcp://").rsplit(":", 1)
    return AsyncTcpClient(host, int(port))


async def _ask(server: Server, event: Event, until: str) -> list[Event]:
    async with _client(server) as client:
        await client.write_event(event)
        out: list[Event] = []
        while True:
            got = await asyncio.wait_for(client.read_event(), 120)
            assert got is not None, f"the server hung up; had {[e.type for e in out]}"
            out.append(got)
            if got.type in (until, "error"):
                return out


def _describe(server: Server) -> Info:
    return Info.from_event(asyncio.run(_ask(server, Describe().event(), "info"))[-1])


def _home_assistant_picks(info: Info) -> dict[str, str]:
    """For each language, the voice a new Home Assistant assistant in it gets: its Wyoming
    integration lists an installed voice under each of its languages, sorted by description
    (else name), and the pipeline takes the first."""
    program = next(t for t in info.tts if t.installed)
    listed: dict[str, list[tuple[str, str]]] = {}
    for voice in program.voices:
        if voice.installed:
            for language in voice.languages:
                listed.setdefault(language, []).append((voice.description or voice.name,
                                                        voice.name))
    return {language: sorted(voices)[0][1] for language, voices in listed.items()}


def _speak(server: Server, voice: str) -> None:
    events = asyncio.run(_ask(server, Synthesize(text="Hello there.", voice=SynthesizeVoice(
        name=voice)).event(), "audio-stop"))
    assert AudioStop.is_type(events[-1].type), events[-1]


def test_each_language_picks_its_own_voice(server: Server) -> None:
    picks = _home_assistant_picks(_describe(server))
    # "ada" sorts before "bert": were every voice listed for every language, a German
    # assistant would get the English ada
    assert picks["de"].split("/")[0] == "bert"
    assert picks["en"].split("/")[0] == "ada"
    # a language no voice was recorded in is still offered (the model speaks it)
    assert "fr" in picks


def test_the_plain_name_follows_the_best_tier(server: Server, workspace: Path,
                                               tiny_model_dir: Path) -> None:
    described = {v.name: v.description for v in _describe(server).tts[0].voices}
    assert "best: instant" in str(described["ada"])
    _speak(server, "ada")
    loads = server.health()["models_loaded"]
    # ada is fine-tuned and exported while the server runs: its plain name (Home
    # Assistant's default) is that now, at a describe soon after and the next request
    _export(tiny_model_dir, workspace / "ada", "ada-v1", "Ada")
    for _ in range(120):  # the server's watch sees the export beside what it renders
        described = {v.name: v.description for v in _describe(server).tts[0].voices}
        if "best: fine-tuned" in str(described["ada"]):
            break
        time.sleep(0.25)
    assert "best: fine-tuned" in str(described["ada"]), described
    assert "ada/instant" in described
    _speak(server, "ada")
    assert server.health()["models_loaded"] == loads + 1  # the export, loaded for ada
    _speak(server, "ada/instant")  # the instant voice still speaks, on its base


def test_an_instant_voice_with_no_base_of_its_own_is_served(server: Server) -> None:
    assert "bob" in {v.name for v in _describe(server).tts[0].voices}
    speech = server.client().audio.speech.create(model="tts-1", voice="bob", input="Hi there.",
                                                 response_format="wav",
                                                 extra_body={"max_frames": 8})
    assert sf.read(io.BytesIO(speech.content))[1] == 24000
    _speak(server, "bob")


def test_the_serve_page_offers_an_instant_voice(tmp_path: Path, tiny_model_dir: Path,
                                                prepared_voice: Path) -> None:
    from gui.pages.serve import servable_voices

    # an instant voice Listen and Read speak (its base known), not yet trained: the Serve
    # page offers it as the server serves it
    make_instant_voice(copy_voice(prepared_voice, tmp_path / "cleo"), str(tiny_model_dir))
    assert [name for name, _ in servable_voices(tmp_path)] == ["cleo"]


def test_a_reply_says_numbers_in_each_sentences_language() -> None:
    # Home Assistant sends no language: an English voice reading German says German
    # numbers, a German voice reading English English ones; the voice's language says
    # only what the words cannot tell
    assert reply_sentences("Es sind 21 Grad. Listed voice number 5.", None, "English") == [
        "Es sind einundzwanzig Grad.", "Listed voice number five."]
    assert reply_sentences("Listed voice number 5.", None, "German") == [
        "Listed voice number five."]
    assert reply_sentences("OK 5.", None, "German") == ["OK fünf."]
