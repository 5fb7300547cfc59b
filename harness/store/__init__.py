"""The results store: what a run leaves on disk and how it is read back.

    samples.py     the SampleSet: images and per-image records, atomic writes, resume, corruption checks
    binding.py     a SampleSet's binding to the configuration that made it, and when it still holds
    summary.py     summary.csv: writing, reading and validating it, merged tables (python -m harness.results)
    provenance.py  run.json: git state, packages, the lock file's hash, device, config
    conditions.py  the condition cache: a conditioner's costly stage once per (prompt, image seed)
"""
