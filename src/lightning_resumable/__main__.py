"""``python -m lightning_resumable inspect CHECKPOINT [--json]`` (see `lightning_resumable.cli`)."""

import sys

from lightning_resumable.cli import main

sys.exit(main())
