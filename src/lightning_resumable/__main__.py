"""``python -m lightning_resumable inspect CHECKPOINT [--json]`` (see `lightning_resumable.tools.cli`)."""

import sys

from lightning_resumable.tools.cli import main

sys.exit(main())
