"""Decoding methods and their own parts, each composed from the framework or standing alone."""
