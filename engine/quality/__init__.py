"""Is the clone any good? Speech recognition, speaker similarity, word error rate, evaluation.

- `asr`: one speech-recognition interface, backends pocketsphinx (offline,
  English), faster-whisper (CTranslate2 folders) and transformers Whisper;
- `transcribe`: fill missing take transcripts, flag doubtful ones;
- `similarity`: speaker similarity (resemblyzer, and the model's own encoder);
- `wer`: normalised word error rate;
- `evaluate` + `report`: render held-out sentences from the zero-shot base,
  every checkpoint and the export; measure; write evaluation.json and report.html.

Nothing heavy is imported at package import; the GUI may import `wer`.
"""
