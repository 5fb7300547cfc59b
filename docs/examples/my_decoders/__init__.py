"""A user's own decoders, kept outside the harness (docs/extending.md)."""
