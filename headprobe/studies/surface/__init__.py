"""The `surface` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.surface import analysis  # noqa: F401  (registers the analysis)
