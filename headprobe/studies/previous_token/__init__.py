"""The `previous_token` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.previous_token import analysis  # noqa: F401  (registers the analysis)
