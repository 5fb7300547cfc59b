"""Model code: the parts every backbone shares at this level, one folder per model family below it.

Shared: gpt_config.py, transformer.py, gpt.py (the LlamaGen-style GPT), masks.py, vq16.py (the VQ-16
tokenizer of LlamaGen and Tar's AR-DTok), eagle_head.py, hub.py, condition.py, conditioners.py,
image_model.py, official_model.py, and the wrappers wrapper.py, guidance.py, replay.py.
Families: llamagen/, tar/, random/ (tiny random stacks for tests). The shapes world is harness/shapes/.
A family imports the shared parts, never another family's folder.
"""
