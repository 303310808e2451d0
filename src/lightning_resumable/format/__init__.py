"""The formats the library writes: the checkpoint's data state (`envelope`, with each kind's state and
the one parser that reads every release), the key derivation a stream was drawn with, and the audit
log. It imports nothing of the library but its errors: ``inspect`` reads checkpoints through it."""
