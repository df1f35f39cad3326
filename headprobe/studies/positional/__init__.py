"""The `positional` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.positional import analysis  # noqa: F401  (registers the analysis)
