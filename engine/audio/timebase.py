"""The codec's timebase, the one place it is written: Qwen3-TTS's 12 Hz tokenizer turns
24 kHz audio into one frame of codes per 1,920 samples, 12.5 frames a second
(qwen3-tts-facts.md). Prepare writes clips at this rate, training counts frames by it,
and every render is written at it.
"""

from __future__ import annotations

#: audio samples per second, in and out of the codec
SAMPLE_RATE = 24000
#: audio samples per frame of codes
SAMPLES_PER_FRAME = 1920
#: frames of codes per second of audio (12.5)
FRAME_RATE = SAMPLE_RATE / SAMPLES_PER_FRAME
