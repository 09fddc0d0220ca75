"""The speech server under load: first byte, throughput by clients, memory over time.

    python bench/bench_serve.py [--voice EXPORT_OR_VOICE] [--frames 24] [--requests 500]
                                [--device cpu] [--json out.json]

Starts `voxshard-engine --json serve` on loopback (without --voice: a custom
voice exported from the tiny random test model) and prints:

- time to first byte of a streamed response (`stream_format` audio, pcm),
  seen by the client, beside `speak --stream`'s first audio on the same text
  (its `first_audio_s`, the worker's own clock, model already loaded), and
  the server's own figure: how long after the worker's first audio the first
  byte left the server (target: at most 50 ms);
- audio seconds served per wall second with 1, 4 and 16 concurrent clients
  (whole renders, batched by the warm worker; target at 16: 3 x one client);
- the server process's resident memory after 10 requests and after
  `--requests` mixed ones (formats, streamed or not, lengths; target: flat).

With `--wyoming` it measures Home Assistant's Wyoming protocol instead (the same
server, `serve --wyoming`), through the `wyoming` package's client: the first
audio-chunk seen by the client and how long after the worker's first audio it
left the server (target: within 50 ms), and the total time and real-time
factor (wall seconds per audio second) for 1 and 4 clients, one-shot
`synthesize` and streamed (`synthesize-start`, a chunk per word, `-stop`).
Wyoming requests carry no options, so each sentence makes as many frames as
the server's own limit for its text. Then the rooms table: the first audio of a
three-sentence reply (what an ESPHome satellite waits for: it gives up after 2 s),
one-shot and streamed, for one room and for two rooms speaking at once (median of
`--repeats`; with two rooms, the later room's; `--rooms-only`: this table alone).

With `--voices N` it measures many voices on one base instead, in this process, on the
warm worker the server runs (`engine.synth.worker.SpeechWorker`), at the real 0.6B
widths with random weights (`--layers` talker layers, 28 by default) and N random
rank-`--rank` adapter voices on every talker projection (with `--predictor`, on every
code predictor projection too): the base's load, then each
adapter voice loaded into the running worker (a "voice" request, while a render runs;
target: under 100 ms, no model load), the resident memory with 1, 4 and 16 voices
loaded (target: each extra voice at most 2 % of the base's), and 8 concurrent renders
on 8 different voices against 8 on one voice (target: at least 0.8 x).

With `--streams` it measures k concurrent streams (k = 1, 2, 4, 8, 16 by default,
`--ks`), all asked at once of the one warm worker, the server started with `--rows`
rows: through Wyoming (one-shot `synthesize` of a three-sentence reply) and through
OpenAI streaming (`stream_format` audio, pcm): the first audio of the k-th stream (the
latest of the k; its ratio to k = 1; target at 8: within 2 x the first stream's plus one
frame group's decode) and the aggregate audio seconds per wall second (ratio to one
stream; target at 8: at least 3 x). `--real-size LAYERS`: the voice is the 0.6B-width
random model (`bench_synth.voice_06b`, that many talker layers) instead of the tiny one,
through OpenAI streaming alone (Wyoming requests carry no frame limit).

With `--listings` it measures how fast the server lists its voices while it renders:
a workspace of `--listing-voices` voices (each exported from the tiny test model) served
over HTTP and Wyoming, then Wyoming `describe`, `GET /health` and `GET /v1/audio/voices`
asked one after another (`--repeats` x 10 each), quiet and while 8 Wyoming streams render
(p50 and p99 at the client; Home Assistant gives a describe 1 s; target: a few ms).

Every sentence makes at most `--frames` codec frames (the tiny model rarely
ends a sentence by itself), so the work per request is bounded and alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SENTENCES = ["The kettle started to whistle.", "She folded the laundry slowly.",
             "Our train was delayed again.", "Fresh bread tastes best warm.",
             "Please water the plants.", "The river curved gently."]


def tiny_voice(root: Path) -> Path:
    import numpy as np

    from engine.model.export import export_custom_voice
    from engine.model.tiny import make_tiny_model

    model = make_tiny_model(root / "tiny-base", seed=0)
    hidden = json.loads((model / "config.json").read_text())["talker_config"]["hidden_size"]
    vector = np.random.default_rng(0).standard_normal(hidden).astype(np.float32)
    return export_custom_voice(model, {}, "Bench", vector, root / "bench-voice", keep_dtype=False)


class Served:
    def __init__(self, voice: Path | None, device: str, cwd: Path, *extra: str) -> None:
        # no voice: `extra` names what to serve (--workspace)
        cmd = [sys.executable, "-m", "engine.cli.main", "--json", "serve",
               *([str(voice)] if voice is not None else []),
               "--port", "0", "--device", device, "--queue", "64", *extra]
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.logs: list[dict[str, Any]] = []
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            if event.get("state") == "serving":
                self.url = event["url"].removesuffix("/v1")
                self.voice = event["voices"][0]
                self.voices = list(event["voices"])
                self.wyoming = event.get("wyoming")
                break
            if event["event"] == "error":
                raise SystemExit(f"the server did not start: {event['message']}")
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            if "request_log" in event:
                self.logs.append(event["request_log"])

    def rss_mb(self) -> float:
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss / 2**20

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def speak_stream_first_audio(voice: Path, text: str, frames: int, device: str,
                             tmp: Path) -> float:
    """`speak --stream`'s first audio, from its own result (model load not included)."""
    out = subprocess.run([sys.executable, "-m", "engine.cli.main", "--json", "speak", str(voice),
                          text, "-o", str(tmp / "speak.wav"), "--stream", "--device", device,
                          "--seed", "1", "--max-frames", str(frames)],
                         capture_output=True, text=True, env={**os.environ,
                                                              "PYTHONPATH": str(ROOT)})
    results = [json.loads(line) for line in out.stdout.splitlines()
               if line.startswith("{") and '"result"' in line]
    if out.returncode != 0 or not results:
        raise SystemExit(f"speak --stream failed: {out.stdout[-500:]}")
    return float(results[-1]["first_audio_s"])


def first_byte(server: Served, http: Any, text: str, frames: int) -> float:
    body = {"model": "tts-1", "voice": server.voice, "input": text, "response_format": "pcm",
            "stream_format": "audio", "max_frames": frames, "seed": 1}
    started = time.perf_counter()
    ttfb = None
    with http.stream("POST", "/v1/audio/speech", json=body) as response:
        for piece in response.iter_raw():
            if piece and ttfb is None:
                ttfb = time.perf_counter() - started
    assert ttfb is not None, "the stream sent no audio"
    return ttfb


def render(http: Any, voice: str, text: str, frames: int, fmt: str = "wav",
           stream: bool = False) -> None:
    body: dict[str, Any] = {"model": "tts-1", "voice": voice, "input": text,
                            "response_format": fmt, "max_frames": frames}
    if stream:
        body["stream_format"] = "audio"
    response = http.post("/v1/audio/speech", json=body)
    response.raise_for_status()


def throughput(server: Served, clients: int, per_client: int, frames: int) -> float:
    import httpx2 as httpx

    before = len(server.logs)

    def client(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=600) as http:
            for k in range(per_client):
                render(http, server.voice, SENTENCES[(i + k) % len(SENTENCES)], frames)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - started
    audio = sum(r["audio_s"] for r in server.logs[before:] if r["status"] == 200)
    return audio / wall


def mixed(server: Served, count: int, frames: int) -> None:
    import httpx2 as httpx

    formats = ["wav", "pcm", "mp3", "flac", "opus"]

    def one(i: int) -> None:
        text = " ".join(SENTENCES[: 1 + i % 3])
        with httpx.Client(base_url=server.url, timeout=600) as http:
            render(http, server.voice, text, frames, formats[i % len(formats)],
                   stream=i % 4 == 0)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


async def wyoming_request(server: Served, text: str, stream: bool) -> tuple[float, float]:
    """One Wyoming request: (seconds to the first audio-chunk, seconds to the end)."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

    host, port = str(server.wyoming).removeprefix("tcp://").rsplit(":", 1)
    end = "synthesize-stopped" if stream else "audio-stop"
    async with AsyncTcpClient(host, int(port)) as client:
        started = time.perf_counter()
        if stream:
            await client.write_event(SynthesizeStart().event())
            for word in text.split(" "):  # as an LLM's words arrive
                await client.write_event(SynthesizeChunk(text=word + " ").event())
            await client.write_event(SynthesizeStop().event())
        else:
            await client.write_event(Synthesize(text=text).event())
        first = None
        while (event := await client.read_event()) is not None:
            if event.type == "audio-chunk" and first is None:
                first = time.perf_counter() - started
            if event.type == "error":
                raise SystemExit(f"the server answered an error: {event.data}")
            if event.type == end:
                break
    assert first is not None, "no audio came"
    return first, time.perf_counter() - started


def bench_wyoming(server: Served, text: str, rows: dict[str, Any]) -> None:
    import asyncio

    asyncio.run(wyoming_request(server, text, False))  # warm-up
    before = len(server.logs)
    firsts = [asyncio.run(wyoming_request(server, text, False))[0] for _ in range(5)]
    lags = [r["first_byte_after_audio_ms"] for r in server.logs[before:]
            if r.get("first_byte_after_audio_ms") is not None]
    rows["wyoming_first_chunk_s"] = sorted(firsts)[2]
    rows["wyoming_first_chunk_after_worker_audio_ms"] = sorted(lags)[len(lags) // 2]
    print(f"wyoming first audio-chunk {rows['wyoming_first_chunk_s']:.3f} s at the client "
          f"(median of 5), left the server {rows['wyoming_first_chunk_after_worker_audio_ms']}"
          f" ms after the worker's first audio (target <= 50)")

    async def together(clients: int, stream: bool) -> list[tuple[float, float]]:
        return await asyncio.gather(*(wyoming_request(server, text, stream)
                                      for _ in range(clients)))

    for stream in (False, True):
        for clients in (1, 4):
            before = len(server.logs)
            started = time.perf_counter()
            answers = asyncio.run(together(clients, stream))
            wall = time.perf_counter() - started
            audio = sum(r["audio_s"] for r in server.logs[before:] if r["status"] == 200)
            key = f"wyoming_{'stream' if stream else 'synthesize'}_{clients}"
            rows[key] = {"first_chunk_s": round(max(a[0] for a in answers), 3),
                         "total_s": round(wall, 3), "audio_s": round(audio, 3),
                         "rtf": round(wall / audio, 3) if audio else None}
            print(f"wyoming {'streamed' if stream else 'synthesize'}, {clients} client(s): "
                  f"{wall:.2f} s for {audio:.2f} s of audio (RTF {rows[key]['rtf']}), "
                  f"slowest first chunk {rows[key]['first_chunk_s']:.3f} s")


async def first_audio(server: Served, text: str, stream: bool, all_heard: Any) -> float:
    """Seconds to the first audio-chunk of one request (a room); it keeps the request going
    until `all_heard` is set (every room has its first audio), then leaves (the server
    cancels the rest: the rooms table needs no whole renders)."""
    import asyncio

    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

    host, port = str(server.wyoming).removeprefix("tcp://").rsplit(":", 1)
    async with AsyncTcpClient(host, int(port)) as client:
        started = time.perf_counter()
        if stream:
            await client.write_event(SynthesizeStart().event())
            for word in text.split(" "):  # as a language model's words arrive
                await client.write_event(SynthesizeChunk(text=word + " ").event())
            await client.write_event(SynthesizeStop().event())
        else:
            await client.write_event(Synthesize(text=text).event())
        while (event := await client.read_event()) is not None:
            if event.type == "error":
                raise SystemExit(f"the server answered an error: {event.data}")
            if event.type == "audio-chunk":
                first = time.perf_counter() - started
                break
        else:
            raise SystemExit("the server hung up before any audio")
        all_heard.count += 1
        while all_heard.count < all_heard.rooms:
            await asyncio.sleep(0.005)
        return first


def bench_rooms(server: Served, repeats: int, rows: dict[str, Any]) -> None:
    """First audio of a three-sentence reply, one room and two at once (see the module doc)."""
    import asyncio
    from types import SimpleNamespace

    reply = " ".join(SENTENCES[2:5])

    async def rooms(count: int, stream: bool) -> float:
        heard = SimpleNamespace(count=0, rooms=count)
        firsts = await asyncio.gather(*(first_audio(server, reply, stream, heard)
                                        for _ in range(count)))
        await asyncio.sleep(0.5)  # the server cancels what the rooms left
        return max(firsts)

    asyncio.run(rooms(1, False))  # warm-up
    table = {}
    print(f"\nfirst audio of a three-sentence reply ({len(reply)} characters), median of "
          f"{repeats} (two rooms: the later room's):\n{'path':<12}{'1 room':>10}{'2 rooms':>10}")
    for stream in (False, True):
        path = "streamed" if stream else "one-shot"
        cells = {}
        for count in (1, 2):
            firsts = sorted(asyncio.run(rooms(count, stream)) for _ in range(repeats))
            cells[count] = firsts[len(firsts) // 2]
        table[path] = {"1_room_s": round(cells[1], 3), "2_rooms_s": round(cells[2], 3)}
        print(f"{path:<12}{cells[1]:>9.3f}s{cells[2]:>9.3f}s")
    rows["wyoming_rooms_first_audio"] = table


# -- many voices on one base (--voices) -------------------------------------------------------

def random_adapter(base: Path, out: Path, seed: int, rank: int, predictor: bool = False
                   ) -> Path:
    """An adapter voice of `base` with random A and B on every talker projection (and with
    `predictor`, every code predictor projection)."""
    import numpy as np
    import torch
    from safetensors import safe_open

    from engine.model.adapter import AdapterRequest, export_adapter
    from engine.synth.adapters import PROJECTIONS

    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {}
    with safe_open(str(base / "model.safetensors"), "pt") as fh:
        for key in fh.keys():
            module = key.removesuffix(".weight")
            adapted = key.startswith("talker.model.layers.") or (
                predictor and key.startswith("talker.code_predictor.model.layers."))
            if adapted and module.endswith(PROJECTIONS):
                out_f, in_f = fh.get_slice(key).get_shape()
                tensors[module + ".lora_A"] = torch.randn(rank, in_f, generator=g) * 0.01
                tensors[module + ".lora_B"] = torch.randn(out_f, rank, generator=g) * 0.01
    hidden = json.loads((base / "config.json").read_text())["talker_config"]["hidden_size"]
    vector = np.random.default_rng(seed).standard_normal(hidden).astype(np.float32) * 0.02
    return export_adapter(AdapterRequest(tensors=tensors, base_dir=base, base=str(base),
                                         rank=rank, alpha=float(rank), speaker=f"v{seed}",
                                         x_vector=vector, info={"run": "bench"}), out)


class InProcess:
    """A `SpeechWorker` in this process, asked one request at a time or many at once."""

    def __init__(self, device: str, dtype: str, rows: int) -> None:
        from engine.synth.worker import SpeechWorker

        self._ends: dict[str, tuple[threading.Event, dict[str, Any]]] = {}
        self.worker = SpeechWorker(self._sink, device=device, dtype=dtype, rows=rows).start()

    def _sink(self, event: Any) -> None:
        end = self._ends.get(str(event.data.get("request") or ""))
        if end is not None and event.kind in ("result", "error"):
            end[1].update(event.data, kind=event.kind)
            end[0].set()

    def submit(self, request: dict[str, Any]) -> threading.Event:
        done: tuple[threading.Event, dict[str, Any]] = (threading.Event(), {})
        self._ends[request["id"]] = done
        self.worker.submit(request)
        return done[0]

    def ask(self, request: dict[str, Any]) -> tuple[dict[str, Any], float]:
        start = time.perf_counter()
        self.submit(request).wait()
        answer = self._ends.pop(request["id"])[1]
        if answer.get("kind") != "result":
            raise SystemExit(f"{request['op']} failed: {answer.get('message')}")
        return answer, time.perf_counter() - start

    def renders(self, voices: list[str], text: str, frames: int, tmp: Path) -> float:
        """Wall seconds for one render per voice in `voices`, all asked at once."""
        start = time.perf_counter()
        waits = [self.submit({"op": "speak", "id": f"s{i}-{time.monotonic_ns()}", "text": text,
                              "out": str(tmp / f"r{i}.wav"), "voice": voice,
                              "options": {"seed": i, "max_frames": frames,
                                          "loudness_lufs": None}})
                 for i, voice in enumerate(voices)]
        for wait in waits:
            wait.wait()
        return time.perf_counter() - start


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def bench_voices(args: argparse.Namespace, tmp: Path, text: str, rows: dict[str, Any]) -> None:
    import gc

    from bench import bench_synth  # the 0.6B-width random model the synthesis bench speaks with

    bench_synth.voice_06b(tmp, args.layers)
    base = tmp / "base-06b"
    count = max(args.voices, 5)
    adapters = [random_adapter(base, tmp / f"adapter-{i}", i, args.rank, args.predictor)
                for i in range(count)]
    gc.collect()
    before = _rss_mb()
    worker = InProcess(args.device, args.dtype, 8)
    _answer, load_s = worker.ask({"op": "load", "id": "load", "voice": str(adapters[0])})
    _answer, _wall = worker.ask({"op": "voice", "id": "v0", "name": "v0",
                                 "voice": str(adapters[0])})
    worker.renders(["v0"] * 2, text, args.frames, tmp)  # the batch and its caches exist now
    rss = {1: _rss_mb()}
    base_mb = rss[1] - before

    def add(i: int) -> tuple[float, float]:
        answer, wall = worker.ask({"op": "voice", "id": f"v{i}", "name": f"v{i}",
                                   "voice": str(adapters[i])})
        if i + 1 in (4, count):
            rss[i + 1] = _rss_mb()
        return wall, float(answer["load_s"])

    idle = sorted(add(i)[0] for i in range(1, 4))
    # the rest while a render runs: the worker is serving, not idle
    busy = worker.submit({"op": "speak", "id": "busy", "text": text, "out": str(tmp / "b.wav"),
                          "options": {"seed": 0, "max_frames": args.frames * 4}})
    timed = [add(i) for i in range(4, count)]
    busy.wait()
    walls = sorted(w for w, _ in timed)
    inside = sorted(s for _, s in timed)
    rows.update({"base_load_s": round(load_s, 2), "base_rss_mb": round(base_mb, 1),
                 "voice_load_idle_ms_median": round(1000 * idle[1], 1),
                 "voice_load_ms_median": round(1000 * walls[len(walls) // 2], 1),
                 "voice_load_ms_max": round(1000 * walls[-1], 1),
                 "voice_load_in_worker_ms_median": round(1000 * inside[len(inside) // 2], 1),
                 "rss_mb_with_voices": {str(k): round(v, 1) for k, v in rss.items()},
                 "load_average": os.getloadavg()[0]})
    where = "talker and code predictor" if args.predictor else "talker"
    print(f"0.6B widths, {args.layers} talker layers, rank-{args.rank} adapters on every "
          f"{where} projection, {args.device} {args.dtype}: the base loads in {load_s:.1f} s "
          f"({base_mb:.0f} MB resident); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"an adapter voice loads into the worker in {rows['voice_load_idle_ms_median']} ms "
          f"idle (median of 3), {rows['voice_load_ms_median']} ms while it renders (median of "
          f"{len(walls)}; max {rows['voice_load_ms_max']} ms; "
          f"{rows['voice_load_in_worker_ms_median']} ms of it inside the worker), no model "
          "load (target: < 100 ms)")
    pool = worker.worker._synth.fast.adapters.pool  # the adapters themselves, exactly
    slot_mb = pool.bytes_per_slot() / 2**20
    rows["adapter_mb_per_voice"] = round(slot_mb, 1)
    rows["adapter_pool_slots"] = pool.slots
    print(f"adapter pool: {slot_mb:.1f} MB a voice ({100 * slot_mb / base_mb:.2f} % of the "
          f"base), {pool.slots} slots for {count} voices ({pool.slots * slot_mb:.0f} MB)")
    per_voice = {k: (v - rss[1]) / max(k - 1, 1) for k, v in rss.items() if k > 1}
    print("resident memory: " + ", ".join(f"{v:.0f} MB with {k} voice(s)" for k, v in rss.items())
          + "; each extra voice " + ", ".join(
              f"{100 * m / base_mb:.2f} % of the base (to {k})" for k, m in per_voice.items())
          + " (target: at most 2 %)")
    names = [f"v{i % count}" for i in range(8)]
    one = worker.renders(["v0"] * 8, text, args.frames, tmp)
    many = worker.renders(names, text, args.frames, tmp)
    rows["throughput_8_voices_vs_one"] = round(one / many, 3)
    print(f"8 concurrent renders: on one voice {one:.1f} s, on 8 voices {many:.1f} s: "
          f"{one / many:.2f} x the one-voice throughput (target: at least 0.8 x)")
    worker.worker.close(timeout=120)


# -- listings while replies render (--listings) ----------------------------------------------

def listing_workspace(root: Path, count: int) -> Path:
    """A workspace of `count` voices, each with one export of the tiny test model."""
    import numpy as np

    from engine.layout.voice import create_voice
    from engine.model.export import export_custom_voice
    from engine.model.tiny import make_tiny_model

    model = make_tiny_model(root / "tiny-base", seed=0)
    hidden = json.loads((model / "config.json").read_text())["talker_config"]["hidden_size"]
    ws = root / "ws"
    for i in range(count):
        name = f"voice{i}"
        create_voice(ws / name, name.title(), "english")
        vector = np.random.default_rng(i).standard_normal(hidden).astype(np.float32)
        export_custom_voice(model, {}, name.title(), vector, ws / name / "exports" / f"{name}-v1",
                            keep_dtype=False)
    return ws


async def _describe_s(server: Served) -> float:
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe

    host, port = str(server.wyoming).removeprefix("tcp://").rsplit(":", 1)
    async with AsyncTcpClient(host, int(port)) as client:
        started = time.perf_counter()
        await client.write_event(Describe().event())
        while (event := await client.read_event()) is not None and event.type != "info":
            pass
        return time.perf_counter() - started


async def _keep_speaking(server: Served, voice: str, text: str, stop: Any) -> int:
    """One room speaking replies back to back until `stop` is set; how many ended."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    host, port = str(server.wyoming).removeprefix("tcp://").rsplit(":", 1)
    done = 0
    while not stop.is_set():
        async with AsyncTcpClient(host, int(port)) as client:
            await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(
                name=voice)).event())
            while (event := await client.read_event()) is not None:
                if event.type == "error":
                    raise SystemExit(f"the server answered an error: {event.data}")
                if event.type == "audio-stop":
                    done += 1
                    break
    return done


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"p50_ms": round(ordered[len(ordered) // 2] * 1000, 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
                            * 1000, 1)}


def bench_listings(server: Served, repeats: int, rows: dict[str, Any]) -> None:
    """Describe, /health and /v1/audio/voices, quiet and while 8 streams render."""
    import asyncio

    import httpx2 as httpx

    count = 10 * repeats
    reply = " ".join(SENTENCES * 2)
    voices = [v for v in server.voices if "/" not in v] or server.voices

    async def measure() -> dict[str, list[float]]:
        def get(http: Any, path: str) -> float:
            started = time.perf_counter()
            assert http.get(path).status_code == 200
            return time.perf_counter() - started

        with httpx.Client(base_url=server.url, timeout=60) as http:
            out: dict[str, list[float]] = {"describe": [], "health": [], "voices": []}
            for _ in range(count):
                out["describe"].append(await _describe_s(server))
                out["health"].append(await asyncio.to_thread(get, http, "/health"))
                out["voices"].append(await asyncio.to_thread(get, http, "/v1/audio/voices"))
        return out

    async def loaded() -> tuple[dict[str, list[float]], int]:
        stop = asyncio.Event()
        # one voice: its 8 replies render as one batch (each other voice would be a model)
        rooms = [asyncio.create_task(_keep_speaking(server, voices[0], reply, stop))
                 for _ in range(8)]
        await asyncio.sleep(3.0)  # every room is rendering
        try:
            figures = await measure()
        finally:
            stop.set()
        return figures, sum(await asyncio.gather(*rooms))

    asyncio.run(measure())  # warm-up
    quiet = asyncio.run(measure())
    busy, replies = asyncio.run(loaded())
    print(f"\nlistings, {count} of each, {len(server.voices)} names served "
          f"(p50 / p99 at the client):\n{'asked':<22}{'quiet':>18}{'8 streams render':>22}")
    table = {}
    for key, label in (("describe", "wyoming describe"), ("health", "GET /health"),
                       ("voices", "GET /v1/audio/voices")):
        table[key] = {"quiet": _percentiles(quiet[key]), "rendering": _percentiles(busy[key])}
        q, b = table[key]["quiet"], table[key]["rendering"]
        print(f"{label:<22}{q['p50_ms']:>8.1f} /{q['p99_ms']:>6.1f} ms"
              f"{b['p50_ms']:>11.1f} /{b['p99_ms']:>6.1f} ms")
    print(f"({replies} replies of {len(reply)} characters ended meanwhile)")
    rows["listings"] = table


async def _openai_stream(server: Served, text: str, frames: int) -> float:
    """Seconds to the first audio byte of one OpenAI streamed request (read to its end)."""
    import asyncio

    import httpx2 as httpx

    def run() -> float:
        body = {"model": "tts-1", "voice": server.voice, "input": text,
                "response_format": "pcm", "stream_format": "audio", "max_frames": frames}
        started = time.perf_counter()
        first = None
        with httpx.Client(base_url=server.url, timeout=600) as http, \
                http.stream("POST", "/v1/audio/speech", json=body) as response:
            response.raise_for_status()
            for piece in response.iter_raw():
                if piece and first is None:
                    first = time.perf_counter() - started
        assert first is not None, "the stream sent no audio"
        return first

    return await asyncio.to_thread(run)


def bench_streams(server: Served, ks: list[int], frames: int, repeats: int,
                  rows: dict[str, Any], paths: tuple[str, ...] = ("wyoming", "openai")) -> None:
    """k concurrent streams through Wyoming and OpenAI streaming (see the module doc)."""
    import asyncio

    reply = " ".join(SENTENCES[2:5])

    async def once(k: int, path: str) -> tuple[float, float]:
        if path == "wyoming":
            answers = await asyncio.gather(*(wyoming_request(server, reply, False)
                                             for _ in range(k)))
            return max(a[0] for a in answers), 0.0
        firsts = await asyncio.gather(*(_openai_stream(server, reply, frames)
                                        for _ in range(k)))
        return max(firsts), 0.0

    table: dict[str, dict[str, Any]] = {}
    print(f"\n{'k':>3}{'path':>10}{'k-th first audio':>18}{'x k=1':>8}"
          f"{'audio s/s':>11}{'x k=1':>8}")
    for path in paths:
        asyncio.run(once(1, path))  # warm-up
        base_first = base_rate = 0.0
        for k in ks:
            firsts, rates = [], []
            for _ in range(repeats):
                before = len(server.logs)
                started = time.perf_counter()
                first, _ = asyncio.run(once(k, path))
                wall = time.perf_counter() - started
                # a request is logged as it ends, just after its client read the end
                waited = time.monotonic() + 30
                while len(server.logs) < before + k and time.monotonic() < waited:
                    time.sleep(0.05)
                audio = sum(r["audio_s"] for r in server.logs[before:] if r["status"] == 200)
                firsts.append(first)
                rates.append(audio / wall)
            first = sorted(firsts)[len(firsts) // 2]
            rate = sorted(rates)[len(rates) // 2]
            if k == ks[0]:
                base_first, base_rate = first, rate
            table.setdefault(path, {})[str(k)] = {
                "kth_first_audio_s": round(first, 3), "first_ratio": round(first / base_first, 2),
                "audio_s_per_s": round(rate, 3), "rate_ratio": round(rate / base_rate, 2)}
            print(f"{k:>3}{path:>10}{first:>17.3f}s{first / base_first:>8.2f}"
                  f"{rate:>11.2f}{rate / base_rate:>8.2f}")
    rows["streams"] = table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voice", help="an exported voice (default: the tiny test model)")
    parser.add_argument("--frames", type=int, default=24, help="codec frames per sentence")
    parser.add_argument("--requests", type=int, default=500, help="mixed requests for memory")
    parser.add_argument("--per-client", type=int, default=4, help="requests per client")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--wyoming", action="store_true",
                        help="measure the Wyoming protocol (Home Assistant) instead")
    parser.add_argument("--repeats", type=int, default=5,
                        help="repeats of each cell of the rooms table (--wyoming)")
    parser.add_argument("--rooms-only", action="store_true",
                        help="with --wyoming: only the rooms table")
    parser.add_argument("--streams", action="store_true",
                        help="measure k concurrent streams (Wyoming and OpenAI streaming)")
    parser.add_argument("--ks", default="1,2,4,8,16", help="stream counts (--streams)")
    parser.add_argument("--rows", type=int, default=8, help="the server's rows (--streams)")
    parser.add_argument("--real-size", type=int, default=0, metavar="LAYERS",
                        help="--streams on the 0.6B-width random model with LAYERS layers")
    parser.add_argument("--listings", action="store_true",
                        help="measure describe, /health and the voice list while 8 render")
    parser.add_argument("--listing-voices", type=int, default=6,
                        help="voices in the workspace (--listings)")
    parser.add_argument("--voices", type=int, default=0,
                        help="measure N adapter voices on one 0.6B-width base instead")
    parser.add_argument("--layers", type=int, default=28, help="talker layers (--voices)")
    parser.add_argument("--rank", type=int, default=16, help="adapter rank (--voices)")
    parser.add_argument("--dtype", default="float32", help="the model's dtype (--voices)")
    parser.add_argument("--predictor", action="store_true",
                        help="adapters on the code predictor's layers too (--voices)")
    return parser


def _run_voices(args: argparse.Namespace, tmp: Path, text: str) -> dict[str, Any]:
    rows: dict[str, Any] = {"voices": args.voices, "layers": args.layers,
                            "rank": args.rank, "frames": args.frames,
                            "predictor": args.predictor}
    try:
        bench_voices(args, tmp, text, rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a 0.6B model and its adapters
    return rows


def _run_listings(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    server = Served(None, args.device, tmp, "--workspace",
                    str(listing_workspace(tmp, args.listing_voices)),
                    "--wyoming", "tcp://127.0.0.1:0")
    rows: dict[str, Any] = {"listing_voices": args.listing_voices}
    try:
        bench_listings(server, args.repeats, rows)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _run_streams(args: argparse.Namespace, voice: Path, tmp: Path, rows: dict[str, Any]
                 ) -> None:
    server = Served(voice, args.device, tmp, "--wyoming", "tcp://127.0.0.1:0",
                    "--rows", str(args.rows))
    rows.update(rows=args.rows, real_size_layers=args.real_size or None)
    try:
        # Wyoming requests carry no options: at real size each sentence would run to
        # the server's own frame limit, so the real-size table is OpenAI's alone
        bench_streams(server, [int(k) for k in args.ks.split(",")], args.frames,
                      max(1, args.repeats // 2), rows,
                      ("openai",) if args.real_size else ("wyoming", "openai"))
    finally:
        server.stop()


def _run_wyoming(args: argparse.Namespace, voice: Path, tmp: Path, text: str,
                 rows: dict[str, Any]) -> None:
    server = Served(voice, args.device, tmp, "--wyoming", "tcp://127.0.0.1:0")
    try:
        if not args.rooms_only:
            bench_wyoming(server, text, rows)
        bench_rooms(server, args.repeats, rows)
    finally:
        server.stop()


def _http_first_audio(server: Served, args: argparse.Namespace, text: str,
                      speak_first: list[float], rows: dict[str, Any]) -> None:
    """`speak --stream`'s first audio (measured before the server started) beside the
    server's first byte, and the server's lag."""
    import httpx2 as httpx

    with httpx.Client(base_url=server.url, timeout=600) as http:
        first_byte(server, http, text, args.frames)  # warm-up
        ttfb = [first_byte(server, http, text, args.frames) for _ in range(5)]
    lags = [r["first_byte_after_audio_ms"] for r in server.logs[-5:]
            if r.get("first_byte_after_audio_ms") is not None]
    rows["speak_stream_first_audio_s"] = sorted(speak_first)[1]
    rows["serve_first_byte_s"] = sorted(ttfb)[2]
    rows["first_byte_after_worker_audio_ms"] = sorted(lags)[len(lags) // 2] if lags else None
    print(f"first audio: speak --stream {rows['speak_stream_first_audio_s']:.3f} s "
          f"(median of 3); server first byte {rows['serve_first_byte_s']:.3f} s at the client "
          f"(median of 5); first byte left the server "
          f"{rows['first_byte_after_worker_audio_ms']} ms after the worker's first audio")


def _http_load(server: Served, args: argparse.Namespace, rows: dict[str, Any]) -> None:
    """Throughput by clients, then resident memory along mixed requests."""
    rates = {}
    for clients in (1, 4, 16):
        rates[clients] = throughput(server, clients, args.per_client, args.frames)
        print(f"{clients:>2} client(s): {rates[clients]:.2f} audio s per s "
              f"({rates[clients] / rates[1]:.2f} x one client)")
    rows["throughput_audio_s_per_s"] = {str(k): round(v, 3) for k, v in rates.items()}
    # resident memory along the way: growth that levels off is the allocator
    # settling; growth in proportion to the requests would be a leak
    done, marks = 0, sorted({10, args.requests // 4, args.requests // 2, args.requests})
    rss: dict[int, float] = {}
    for mark in marks:
        mixed(server, mark - done, args.frames)
        done = mark
        rss[mark] = server.rss_mb()
    rows["rss_mb_after"] = {str(k): round(v, 1) for k, v in rss.items()}
    failed = [r for r in server.logs if r["status"] != 200]
    rows["non_200"] = len(failed)
    trail = ", ".join(f"{v:.0f} MB after {k}" for k, v in rss.items())
    print(f"server memory: {trail} mixed requests ({rss[marks[-1]] - rss[10]:+.0f} MB "
          f"from 10 to {marks[-1]}); {len(failed)} request(s) not answered 200")


def _figures(args: argparse.Namespace, tmp: Path, text: str) -> dict[str, Any]:
    """Run the table the arguments ask for; its figures."""
    if args.voices:
        return _run_voices(args, tmp, text)
    if args.listings:
        return _run_listings(args, tmp)
    if args.real_size:
        from bench import bench_synth  # the 0.6B-width random model the synthesis bench speaks with

        voice = bench_synth.voice_06b(tmp, args.real_size)
    else:
        voice = Path(args.voice) if args.voice else tiny_voice(tmp)
    rows: dict[str, Any] = {"voice": str(voice), "frames": args.frames}
    if args.streams:
        _run_streams(args, voice, tmp, rows)
    elif args.wyoming:
        _run_wyoming(args, voice, tmp, text, rows)
    else:
        speak_first = [speak_stream_first_audio(voice, text, args.frames, args.device, tmp)
                       for _ in range(3)]
        server = Served(voice, args.device, tmp)
        try:
            _http_first_audio(server, args, text, speak_first, rows)
            _http_load(server, args, rows)
        finally:
            server.stop()
    return rows


def main() -> None:
    args = _parser().parse_args()
    if args.voices and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc keeps freed blocks under its (growing) mmap threshold, so resident memory
        # would count every pool the voices grew out of; blocks over 1 MB go back at free
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)})
    rows = _figures(args, Path(tempfile.mkdtemp(prefix="bench-serve-")), " ".join(SENTENCES[:2]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
