"""Heads that work together: which earlier heads each head reads, through its query, key and
value (METHODS §18). `analysis` (the `composition` analysis of a run: its scorer, tables,
circuits and the `reads` query; `run_options`, its run options; `report` and `graph`, its report
section and figure), `intervention` (at the receiver, every sender at once), `path_patching`
(through the model: exact on a sample, first order for every edge), `weights` (weights-only
Q-, K-, V-composition with a Gaussian null), `sweep` and `tables` (the same as a Python API)."""

from headprobe.studies.composition import analysis  # noqa: F401  (registers the analysis)
