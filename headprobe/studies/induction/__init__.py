"""The `induction` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.induction import analysis  # noqa: F401  (registers the analysis)
