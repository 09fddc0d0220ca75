"""Voxshard engine: the headless core (workspace, audio, models, training, speech).

Importing `engine` is cheap and never pulls in torch, ray or Qt; the heavy
parts load when an operation needs them. See README.md for the Python API.
"""

__version__ = "0.1.0"
