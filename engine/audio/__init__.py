"""Audio: file I/O, loudness, voice activity and slicing, quality checks, import, prepare.

Submodules are imported where needed; `io`, `loudness`, `vad`, `quality` and
`transcripts` are light (numpy, scipy, soundfile) and never import torch.
"""
