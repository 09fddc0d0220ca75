"""One preset, one run (issue 51): a data-volume preset chosen in the window trains exactly
what `voxshard-engine train` trains with no flags (or with `--preset` of that band), for a
voice of every band and every preset, and shows the engine's values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from engine.config.layers import paths
from engine.config.schema import value_problem
from engine.config.train import TrainConfig
from engine.layout.manifest import prepared_folder
from engine.train.presets import VOLUMES, preset
from gui.app import MainWindow
from gui.pages.train import TrainPage
from tests.helpers.voices import voice_with_clips

ROOT = Path(__file__).resolve().parents[1]

#: usable minutes of a voice in each band of `VOLUMES`, as 30-second clips
BAND_MINUTES = (4.0, 20.0, 40.0)


def dry_runs(*commands: list[str]) -> list[dict[str, Any]]:
    """The configs the CLI resolves for each `voxshard-engine --json ... --dry-run` (one
    process runs them all, the CLI's own entry point; a run's name is left out: a
    timestamp)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # the CLI points fd 1 at stderr once it has its event stream: each run gets it back
    script = ("import json, os, sys\nfrom engine.cli.main import main\n"
              "out, fd = sys.stdout, os.dup(1)\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    os.dup2(fd, 1)\n    sys.stdout = out\n    main(argv)\n")
    argvs = [["--json", *c, "--dry-run"] for c in commands]
    out = subprocess.run([sys.executable, "-c", script, json.dumps(argvs)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in events if e["event"] == "error"], events
    configs = [e["config"] for e in events if e["event"] == "result"]
    assert len(configs) == len(commands), out.stdout[-3000:]
    for config in configs:
        config["run"].pop("name")
    return configs


def banded_voice(tmp_path: Path, minutes: float) -> Path:
    """A prepared voice of `minutes` of usable audio, with the totals prepare reports."""
    voice = voice_with_clips(tmp_path, int(minutes * 2), 30.0)
    prepared_folder(voice).report.write_text(json.dumps(
        {"totals": {"minutes_usable": minutes}, "takes": []}))
    return voice


def test_a_preset_in_the_window_trains_what_the_cli_trains_with_no_flags(
        qtbot, window: MainWindow, tmp_path: Path, tiny_model_dir: Path) -> None:
    page: TrainPage | None = None
    commands: list[list[str]] = []
    #: (voice's band, preset chosen, window's args, the CLI's) of every pair
    pairs: list[tuple[int, int, list[str], list[str]]] = []
    for band, minutes in enumerate(BAND_MINUTES):
        voice = banded_voice(tmp_path / str(band), minutes)
        window.ctx.set_voice(voice)
        page = window.show_page(TrainPage)  # type: ignore[assignment]
        assert page is not None
        s = page.settings
        s.base.setEditText(str(tiny_model_dir))
        # the page chose the preset of the voice's amount of audio, and shows its values:
        # the engine's, not step counts of its own
        assert s.preset.currentIndex() == band
        engine = preset(minutes, 0)["run"]
        assert s.fields["steps"].value() is None  # by epochs
        assert (s.epochs.value(), s.ckpt_every.value()) == (engine["epochs"],
                                                            engine["checkpoint_every"])
        cli = ["train", str(voice), "--base", str(tiny_model_dir)]
        pairs.append((band, band, page.train_args(), cli))
        # every other band's preset on this voice: the engine's preset of that band, from
        # both
        for chosen in (i for i in range(len(VOLUMES)) if i != band):
            s.preset.setCurrentIndex(chosen)
            pairs.append((band, chosen, page.train_args(),
                          [*cli, "--preset", VOLUMES[chosen].key]))
        s.preset.setCurrentIndex(band)
    assert page is not None
    s = page.settings
    commands = [c for _, _, shown, cli in pairs for c in (shown, cli)]
    configs = dry_runs(*commands)
    for i, (band, chosen, _, _) in enumerate(pairs):
        shown, cli = configs[2 * i], configs[2 * i + 1]
        assert shown == cli, (band, chosen)
        engine = preset(0, 0, VOLUMES[chosen].key)["run"]
        assert (shown["run"]["steps"], shown["run"]["epochs"],
                shown["run"]["checkpoint_every"]) == (None, engine["epochs"],
                                                      engine["checkpoint_every"])
        # every value of the resolved config inside its setting's bounds
        for path in paths(TrainConfig):
            section, _, name = path.partition(".")
            assert value_problem(path, shown[section].get(name)) is None, (path, band, chosen)
    for i, (band, chosen, window_args, _) in enumerate(pairs):
        if band != chosen:
            continue
        shown, cli = configs[2 * i], configs[2 * i + 1]
        assert shown["optim"]["lr"] == s.lr.value()
        # the CLI's config (what its run saves) comes back into the form as that preset
        s.preset.setCurrentIndex(s.preset.findText("Custom"))
        s.load_run_config({**cli, "run": {**cli["run"], "name": "r"}})
        assert s.preset.currentIndex() == band, band
        assert s.train_args("v") == [*window_args[:1], "v", *window_args[2:]]
    # an edit makes it the form's own: then the form's values are sent
    s.epochs.setValue(s.epochs.value() + 1)
    assert s.preset.currentText() == "Custom"
    custom = s.train_args("v")
    assert custom[custom.index("--epochs") + 1] == f"{s.epochs.value():g}"
    assert "--preset" not in custom and "--steps" not in custom
