"""The `parsing` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.parsing import analysis  # noqa: F401  (registers the analysis)
