"""The core: the stream's order, draws, position and randomness, pure functions and values; it imports
neither Lightning nor the layers above it."""
