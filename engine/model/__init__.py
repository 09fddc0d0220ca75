"""Models: the official Qwen3-TTS code, loading, the tiny test model, export."""
