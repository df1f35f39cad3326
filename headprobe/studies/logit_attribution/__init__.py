"""The `logit_attribution` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.logit_attribution import analysis  # noqa: F401  (registers the analysis)
