"""bench/gpu_proof.py on a machine without a GPU: one line, exit 0, and no Ray at import.

The GPU machine may have no Ray, so the module must import without it; the
whole `--tiny` run (Ray-free and Ray, ~2-3 minutes on 2 cores) is a bench
command, not part of the suite (see the README).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_proof_without_a_gpu_says_so_in_one_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the proof itself runs (bench/gpu_proof.py)")
    code = ("import sys; import bench.gpu_proof as g; "
            "assert 'ray' not in sys.modules, 'gpu_proof imports ray at import'; "
            "sys.exit(g.main([]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_proof: no NVIDIA GPU visible"), lines
    assert "ray" not in out.stderr.lower()


def test_gpu_proof_on_a_bare_python_names_what_is_missing_in_one_line() -> None:
    """Without site-packages (python -S: only the standard library, as bare as a machine
    gets) the proof stops before any work with one line naming the missing modules."""
    code = "import sys; import bench.gpu_proof as g; sys.exit(g.main(['--tiny']))"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu_proof: missing torch (torch;"), lines[0]
    for name in ("transformers", "librosa", "soundfile", "qwen_tts", "bench/device_kit.sh"):
        assert name in lines[0], name
    assert "Traceback" not in out.stderr, out.stderr[-2000:]


def test_model_flops_counts_the_step() -> None:
    """The MFU numerator: forward + input gradients + weight gradients (+ attention)."""
    import tempfile

    from bench.gpu_proof import model_flops
    from engine.model.tiny import make_tiny_model

    tiny = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    full = model_flops(tiny, 4, 2.0, "talker")
    lora = model_flops(tiny, 4, 2.0, "lora")
    # LoRA skips the base weights' gradients: two thirds of the matmul work remain
    assert 0.6 * full < lora < 0.72 * full
    # twice the clips, twice the work
    assert model_flops(tiny, 8, 2.0, "talker") == pytest.approx(2 * full, rel=1e-9)
