"""The `duplicate_token` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.duplicate_token import analysis  # noqa: F401  (registers the analysis)
