"""The `sink` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.sink import analysis  # noqa: F401  (registers the analysis)
