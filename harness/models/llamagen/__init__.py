"""LlamaGen (FoundationVision): the bundle loader with official key names and its FLAN-T5 captions."""
