"""Prompt sets and the downloads they (and the evaluators) need.

    prompts.py    the shapes world's prompts and any local .txt / .jsonl prompts file
    official.py   COCO 2017 val 5k, GenEval, DPG-Bench and PartiPrompts, from their official sources
    downloads.py  pinned, hash-checked, cached downloads
"""
