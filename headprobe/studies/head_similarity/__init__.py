"""The `head_similarity` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.head_similarity import analysis  # noqa: F401  (registers the analysis)
