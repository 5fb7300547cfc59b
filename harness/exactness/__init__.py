"""Exactness checks with length: a first-order Markov "image model" whose law is known in closed
form (markov.py), per-position and adjacent-pair statistics of a decoder's images against it
(stats.py), the check of one decoder (check.py; the deliberately broken decoders that must fail
are baselines/methods/controls.py), and the command
`python -m harness.exactness DECODER` that prints the table (__main__.py; docs/field.md)."""
