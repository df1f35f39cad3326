"""The `ablation` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.ablation import analysis  # noqa: F401  (registers the analysis)
