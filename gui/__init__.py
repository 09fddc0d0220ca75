"""Voxshard desktop app (PySide6 + pyqtgraph). Never imports torch or ray."""

__version__ = "0.1.0"
