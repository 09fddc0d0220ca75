"""The Train page, in parts: settings panel, GPU probe, stats bar, charts, run controller."""

from gui.pages.train.controller import STATE_LABELS, RunController
from gui.pages.train.gpus import Gpu, GpuProbe, attach_processes, parse_nvidia_smi
from gui.pages.train.page import TrainPage
from gui.pages.train.settings import BASE_MODELS, PRESETS, Preset, TrainSettings, preset_for

__all__ = ["BASE_MODELS", "PRESETS", "STATE_LABELS", "Gpu", "GpuProbe", "Preset", "RunController",
           "TrainPage", "TrainSettings", "attach_processes", "parse_nvidia_smi", "preset_for"]
