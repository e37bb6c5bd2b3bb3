"""The repository's root, for every test that runs a command from it or reads a file of it."""

import os
import pathlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT_PATH = pathlib.Path(ROOT)
