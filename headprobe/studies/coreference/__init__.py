"""The `coreference` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.coreference import analysis  # noqa: F401  (registers the analysis)
