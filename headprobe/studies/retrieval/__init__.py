"""The `retrieval` analysis and its causal check, whole: see `analysis` (the copy scores, the
success map, the role), `check` (`--retrieval-check K`) and `report` (their report sections)."""

from headprobe.studies.retrieval import analysis, causal  # noqa: F401  (register the analyses)
