"""Code and fixtures the tests share (fixture modules are plugins: tests/conftest.py)."""
