"""Lumina-mGPT (Alpha-VLLM): the Chameleon LM, its sequence layout, Chameleon's VQGAN and the bundle loader."""
