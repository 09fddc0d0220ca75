"""The bottom layer: typed errors, events, atomic writes, storage. Imports nothing of the engine."""
