"""Playing speech while the engine still writes it: the real writer, the real device."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.synth.stream import GrowingFile
from gui.audio import GrowingWav, Player


def _blocks(n: int = 12, size: int = 2400) -> list[np.ndarray]:
    t = np.arange(n * size) / 24000.0
    tone = (0.3 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)
    return [tone[i * size:(i + 1) * size] for i in range(n)]


def test_growing_wav_reads_what_the_engine_wrote_so_far(tmp_path: Path) -> None:
    path = tmp_path / "out.wav"
    writer = GrowingFile(path, "wav")  # the engine's own streaming writer
    blocks = _blocks()
    writer.write(blocks[0])
    reader = GrowingWav(path)
    got = [reader.read_new()]
    for b in blocks[1:]:
        writer.write(b)
        got.append(reader.read_new())
    # the engine replaces the path with its finished render: the reader keeps the stream
    writer.close()
    sf.write(str(tmp_path / "final.wav"), np.zeros(100, dtype=np.float32), 24000)
    os.replace(tmp_path / "final.wav", path)
    got.append(reader.read_new())
    reader.close()
    audio = np.concatenate(got)
    expected = np.concatenate(blocks)
    assert reader.samplerate == 24000 and len(audio) == len(expected)
    assert np.max(np.abs(audio - expected)) < 1.0 / 16384  # 16-bit PCM rounding


def test_player_plays_a_stream_as_it_grows(qtbot, pulse, tmp_path: Path) -> None:
    path = tmp_path / "speech.wav"
    writer = GrowingFile(path, "wav")
    blocks = _blocks(n=20)
    writer.write(blocks[0])
    player = Player()
    with qtbot.waitSignal(player.started, timeout=10000):
        assert player.play_stream(path)

    def write_rest() -> None:  # slower than real time: the player waits, it does not end
        for b in blocks[1:]:
            time.sleep(0.15)
            writer.write(b)
        writer.close()

    thread = threading.Thread(target=write_rest)
    thread.start()
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=30000)
    assert player.playing  # caught up with the writer: still playing, not finished
    with qtbot.waitSignal(player.finished, timeout=30000):
        player.end_stream()
    total = sum(len(b) for b in blocks)
    assert player._pos == total  # every streamed sample was played, once


def test_listen_says_when_playback_had_to_wait_for_the_speech(
        qtbot, pulse, window, voice: Path) -> None:
    """Speech made slower than real time plays with pauses: Listen says so after playback
    (and that the saved render has none), instead of leaving the user to think it broken.
    The worker's messages are the speech worker's own signals; writer and player are real."""
    from gui.pages.listen import PLAYBACK_GAPS, ListenPage

    window.ctx.set_voice(voice)
    page = window.show_page(ListenPage)
    assert isinstance(page, ListenPage)
    player = window.ctx.player

    def speak(rid: str, delay: float) -> None:
        out = voice / "renders" / f"{rid}.wav"
        out.parent.mkdir(exist_ok=True)
        writer = GrowingFile(out, "wav")
        blocks = _blocks(n=10)
        writer.write(blocks[0])
        page.request, page._pending = rid, (out, "Hello.", {"kind": "zero_shot"}, "")
        with qtbot.waitSignal(player.started, timeout=10000):
            page.speech.partial.emit(rid, str(out))
        if delay:
            # the device has played the first block before the next is written: a loaded
            # machine's sound server can start pulling seconds late (CI once heard the
            # whole slow stream arrive before its first callback, so nothing waited)
            qtbot.waitUntil(lambda: player.position_s() >= 0.1, timeout=10000)
        for b in blocks[1:]:
            if delay:
                qtbot.wait(int(delay * 1000))  # each block (0.1 s) comes after 0.3 s
            writer.write(b)
        writer.close()
        with qtbot.waitSignal(player.finished, timeout=30000):
            page.speech.finished.emit(rid, {"summary": "Spoke 1.0 s.", "duration_s": 1.0})

    speak("slow", 0.3)
    assert player.underruns > 0
    assert page.state.text() == "Spoke 1.0 s. " + PLAYBACK_GAPS
    # everything there before it plays: a gap only if the device itself starved (load)
    speak("fast", 0.0)
    starved = bool(player.underruns or player.device_underflows)
    assert page.state.text() == "Spoke 1.0 s." + (" " + PLAYBACK_GAPS if starved else "")
