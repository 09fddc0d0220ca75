"""Shared test set-up. Fixtures of each area live in tests/fixtures_*.py."""

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
    "tests.fixtures_model",
    "tests.fixtures_audio",
    "tests.fixtures_mixtures",
]
