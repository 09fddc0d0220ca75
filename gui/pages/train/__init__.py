"""The Train page, in parts: settings panel, GPU probe, stats bar, charts, run controller."""

from .controller import STATE_LABELS, RunController
from .gpus import Gpu, GpuProbe, attach_processes, parse_nvidia_smi
from .page import TrainPage
from .settings import BASE_MODELS, PRESETS, Preset, TrainSettings, preset_for

__all__ = ["BASE_MODELS", "PRESETS", "STATE_LABELS", "Gpu", "GpuProbe", "Preset", "RunController",
           "TrainPage", "TrainSettings", "attach_processes", "parse_nvidia_smi", "preset_for"]
