"""The `dependency` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.dependency import analysis  # noqa: F401  (registers the analysis)
