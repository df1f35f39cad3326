"""The `ov_copying` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.ov_copying import analysis  # noqa: F401  (registers the analysis)
