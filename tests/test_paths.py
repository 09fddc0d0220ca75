"""Paths as a person types them: relative, `~`, spaces and non-ASCII, in every command.

The slow test is the README's CLI walkthrough, run as written from a fresh
folder whose name has a space and an accent, with `~` pointing at a home
folder that has them too: the tiny model in place of the hub id, a folder of
real (piper) recordings with an LJSpeech metadata.csv as `~/recordings`, and
a prepared clip that exists for `--reference`. Before the fix, `train
voices/ada` from such a folder failed with pyarrow's "URI has empty scheme".

The commands run in this process through `engine.cli.main.main` (the same
code as the `voxshard-engine` script, without paying a Python start-up per
command); training runs on a real local Ray cluster with 2 workers for 2
steps, then `--resume` to step 3.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from engine.cli.main import build_parser, main, normalize_paths
from engine.core.storage import expand_arg, is_uri, storage_arg, user_path
from engine.layout.voice import create_voice, list_voices, open_voice

# -- fast: the rules -----------------------------------------------------------------------


def test_user_path_expands_home_and_makes_absolute(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home dir ü"
    here = tmp_path / "fresh folder é"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    assert user_path("~/recordings") == home / "recordings"
    assert user_path("voices/ada") == here / "voices" / "ada"
    assert user_path("./a b/ç") == here / "a b" / "ç"
    assert user_path(f"file://{here}/x%20y") == here / "x y"
    # symlinks are kept as typed, not resolved
    (here / "link").symlink_to(home, target_is_directory=True)
    assert user_path("link/z") == here / "link" / "z"


def test_expand_arg_leaves_hub_ids_and_uris(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert expand_arg("Qwen/Qwen3-TTS-12Hz-1.7B-Base") == "Qwen/Qwen3-TTS-12Hz-1.7B-Base"
    assert expand_arg("s3://bucket/a b") == "s3://bucket/a b"
    assert expand_arg("~/models/tiny") == str(tmp_path / "models" / "tiny")
    (tmp_path / "models é").mkdir()
    assert expand_arg("models é") == str(tmp_path / "models é")
    assert is_uri("gs://b/x") and not is_uri("file:///x") and not is_uri("/x")
    assert storage_arg("s3://bucket/prefix/") == "s3://bucket/prefix"
    assert storage_arg("~/shared runs") == str(tmp_path / "shared runs")
    assert storage_arg("") is None


def test_cli_arguments_are_normalized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "hôme"))
    monkeypatch.chdir(tmp_path)
    parser = build_parser()

    def parsed(*argv: str) -> argparse.Namespace:
        args = parser.parse_args(list(argv))
        normalize_paths(args)
        return args

    a = parsed("import", "voices/ada", "~/recordings/", "my clips/ü.wav",
               "--transcripts", "~/recordings/metadata.csv")
    assert a.voice == str(tmp_path / "voices" / "ada")
    assert a.paths == [str(tmp_path / "hôme" / "recordings"), str(tmp_path / "my clips" / "ü.wav")]
    assert a.transcripts == str(tmp_path / "hôme" / "recordings" / "metadata.csv")
    a = parsed("train", "voices/ada", "--base", "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
               "--storage", "~/shared")
    assert a.base == "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
    assert a.storage == str(tmp_path / "hôme" / "shared")
    assert parsed("train", "v", "--base", "b", "--storage", "s3://b/p/").storage == "s3://b/p"
    assert parsed("train", "v", "--base", "b", "--storage", "default").storage == "default"
    a = parsed("speak", "~/exports/ada", "Hi.", "-o", "out é.wav", "--reference", "c.wav")
    assert a.model == str(tmp_path / "hôme" / "exports" / "ada")
    assert a.output == str(tmp_path / "out é.wav") and a.reference == str(tmp_path / "c.wav")


def test_workspace_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    v = create_voice("voices/Zoë Ñ", "Zoë")
    assert v.path == tmp_path / "voices" / "Zoë Ñ" and v.path.is_absolute()
    assert open_voice("voices/Zoë Ñ").runs_dir == tmp_path / "voices" / "Zoë Ñ" / "runs"
    create_voice("~/v 2", "Two")
    assert open_voice("~/v 2").path == tmp_path / "home" / "v 2"
    assert list_voices("voices") == [tmp_path / "voices" / "Zoë Ñ"]
    # the storage setting is remembered as typed, made absolute
    v.set_storage("~/shared runs")
    assert open_voice(v.path).storage == str(tmp_path / "home" / "shared runs")
    v.set_storage(None)
    assert open_voice(v.path).storage is None


def test_api_calls_take_paths_as_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    import soundfile as sf

    from engine import api

    home = tmp_path / "hôme dir"
    rec = home / "rec ü"
    rec.mkdir(parents=True)
    t = np.arange(24000) / 24000.0
    sf.write(rec / "take 1.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
    (rec / "list.csv").write_text("file,text\ntake 1.wav,A tone.\n", encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    voice = api.create_voice("~/voices/é a", speaker="Ea")
    assert voice.path == home / "voices" / "é a"
    out = api.import_files("~/voices/é a", ["~/rec ü/"], transcripts="~/rec ü/list.csv")
    assert len(out["imported"]) == 1, out
    assert api.open_voice("~/voices/é a").list_takes()[0].text == "A tone."


# -- slow: the README walkthrough ------------------------------------------------------------


def _recordings(folder: Path, piper_sentences: list[dict[str, Any]], n: int) -> None:
    """A folder as a person might have it: WAVs and an LJSpeech metadata.csv."""
    folder.mkdir(parents=True)
    lines = []
    for i, s in enumerate(piper_sentences[:n]):
        name = f"take {i:02d}"
        (folder / f"{name}.wav").write_bytes(Path(s["path"]).read_bytes())
        lines.append(f"{name}|{s['text']}|{s['text']}")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _engine(*argv: str) -> int:
    return main([*argv])


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")  # both `train` runs use the session's cluster
def test_readme_walkthrough_with_relative_paths(tmp_path: Path, piper_sentences: list[dict],
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home dir ü"
    here = tmp_path / "fresh folder é"
    here.mkdir()
    _recordings(home / "recordings", piper_sentences, 8)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    prev_term = signal.getsignal(signal.SIGTERM)
    t0 = time.time()
    steps: dict[str, float] = {}

    def run(*argv: str) -> str:
        t = time.time()
        rc = _engine(*argv)
        out = capsys.readouterr()
        steps[argv[0]] = steps.get(argv[0], 0.0) + time.time() - t
        assert rc == 0, f"{argv}: {out.err[-3000:]}"
        return out.out

    try:
        # the tiny model in place of the hub id, at a relative path
        run("make-tiny-model", "models/tiny")
        base = "models/tiny"
        run("voice", "new", "voices/ada", "--speaker", "Ada", "--language", "english")
        run("prompts", "next", "voices/ada", "--count", "3")
        out = run("import", "voices/ada", "~/recordings/", "--transcripts",
                  "~/recordings/metadata.csv")
        assert out.startswith("Imported 8 file(s)"), out
        run("prepare", "voices/ada")
        run("plan", "voices/ada", "--base", base)
        # every GPU by default; on this CPU machine 2 workers (FSDP over gloo), 2 steps
        out = run("train", "voices/ada", "--base", base, "--workers", "2", "--steps", "2",
                  "--checkpoint-every", "1", "--cpu")
        assert "Finished" in out and "at step 2/2" in out, out
        out = run("train", "voices/ada", "--base", base, "--resume", "--workers", "2",
                  "--steps", "3", "--cpu")
        assert "at step 3/3" in out, out
        run("export", "voices/ada", "exports/ada")
        run("speak", "exports/ada", "Any text, in Ada's voice.", "-o", "hello.wav")
        run("speak", "voices/ada", "Straight from the latest checkpoint.", "-o", "ckpt.wav")
        clip = sorted((here / "voices" / "ada" / "prepared" / "clips").glob("0001*.wav"))[0]
        run("speak", base, "Zero-shot preview.", "--reference",
            f"voices/ada/prepared/clips/{clip.name}", "-o", "preview.wav")
        run("compare", "voices/ada", "ab/", "--sentences", "One sentence.", "Another one.")
    finally:
        signal.signal(signal.SIGTERM, prev_term)

    voice = here / "voices" / "ada"
    assert len(list((voice / "takes").glob("*.json"))) == 8
    runs = [p for p in (voice / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    ckpts = sorted(p.name for p in runs[0].glob("checkpoint_step_*"))
    assert ckpts[-1] == "checkpoint_step_0000003", ckpts
    cfg = json.loads((runs[0] / "config.json").read_text())
    assert Path(cfg["model"]["base"]).is_absolute()
    assert (here / "exports" / "ada" / "config.json").is_file()
    for wav in ("hello.wav", "ckpt.wav", "preview.wav"):
        assert (here / wav).stat().st_size > 1000, wav
    assert any((here / "ab").rglob("*.wav"))
    # nothing was written where a relative path would have landed elsewhere
    assert not (Path(os.sep) / "voices").exists()
    print(f"\nREADME walkthrough with relative paths: {time.time() - t0:.1f} s "
          f"(train {steps['train']:.1f} s for 2 runs; "
          + ", ".join(f"{k} {v:.1f}" for k, v in steps.items() if k != "train") + ")")
