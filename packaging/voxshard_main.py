"""Entry script of the frozen app (PyInstaller needs a file, not a console script)."""

import sys

from gui.start import main

if __name__ == "__main__":
    sys.exit(main())
