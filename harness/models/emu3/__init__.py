"""Emu3 (`model=emu3_gen`, `emu3_tiny`) through transformers' Emu3 modules."""
