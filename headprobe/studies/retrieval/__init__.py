"""The `retrieval` analysis and its causal check, whole: see `analysis` (the copy scores, the
success map, the role), `causal` (`--retrieval-check K`), `needles` (the needle probe),
`needle_probe` (its options, checks and stream, as a run reads them) and `report` (their report
sections)."""

from headprobe.studies.retrieval import analysis, causal, needle_probe  # noqa: F401  (register them)
