"""Speech recognition: recognisers (pocketsphinx, faster-whisper, transformers Whisper) and WER.

Below prepare, synth and quality, which all use it. Nothing heavy at package import."""
