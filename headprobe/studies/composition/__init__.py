"""Heads that work together: which earlier heads each head reads, through its query, key and
value (METHODS §18). `intervention` (at the receiver, every sender at once), `path_patching`
(through the model: exact on a sample, first order for every edge), `weights` (weights-only
Q-, K-, V-composition with a Gaussian null). Not yet an analysis of a run: a Python API."""
