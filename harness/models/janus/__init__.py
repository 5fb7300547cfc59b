"""Janus-Pro (`model=janus_pro_1b`, `janus_pro_7b`, `janus_tiny`) through transformers' Janus modules."""
