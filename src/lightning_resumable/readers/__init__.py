"""The readers: one adapter per data library (how it recognises a loader, builds the reader, its position
keys, its resume policy, its refusals), and what they share."""
