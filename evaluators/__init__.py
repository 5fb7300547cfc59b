"""Evaluators: each reads a SampleSet (harness.store.samples) and returns an EvalResult (harness.api).

One module per metric family, named after its config option in conf/evaluator/: speed, fid, hpsv2,
geneval, dpg_bench. Heavy dependencies are imported lazily inside the module that needs them.
"""
