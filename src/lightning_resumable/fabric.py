"""Exact resume in a Lightning Fabric loop: the public home of the Fabric helpers.

``from lightning_resumable.fabric import loader_state, restore_loader`` (as in 0.2.0). The code lives in
`lightning_resumable.lightning.fabric`, whose docstring has the example.
"""

from lightning_resumable.lightning.fabric import loader_state, restore_loader

__all__ = ["loader_state", "restore_loader"]
