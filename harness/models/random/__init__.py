"""Random model stacks for tests and smoke runs: seeded weights, a patch tokenizer, no files."""
