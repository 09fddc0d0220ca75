"""Shared test set-up. Fixtures live in tests/helpers/ (registered below as plugins), with
the helper code tests share; no test file imports another."""

from __future__ import annotations

import os

# Before torch is imported anywhere: 2-core machines crawl with more threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest_plugins = [
    "pytester",  # tests/test_helpers_qt_leaks.py runs a pytest of its own
    "tests.helpers.model",  # tiny_model_dir
    "tests.helpers.speech",  # piper_synth, piper_sentences, prepared_voice
    "tests.helpers.mixtures",  # mixtures, interview_voice
    "tests.helpers.gui",  # settings, workspace, ctx, window, voice, pulse
    "tests.helpers.qt_leaks",  # every test: no Qt thread or timer left running after it
    "tests.helpers.ray_cluster",  # ray_cluster (session), the own_cluster marker
    "tests.helpers.runs",  # trained_run, lora_run, lora_predictor_run (session)
    "tests.helpers.xserver",  # xvfb: a real X server
]
