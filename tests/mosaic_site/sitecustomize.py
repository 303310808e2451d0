"""Run a MosaicML Streaming example or benchmark by hand in the CPU test environment, which has no
torchvision (see `tests.e2e.train.import_streaming`):
``PYTHONPATH=tests/mosaic_site python examples/mosaic_stream.py``. Python imports this module at
start-up, in every process the script starts, and it imports ``streaming`` with the stand-in."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.e2e.train import import_streaming

import_streaming()
