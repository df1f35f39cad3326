"""The `ablation` analysis, whole: see `analysis` (and `report`, its report section)."""

from headprobe.studies.ablation import analysis, validation  # noqa: F401  (register the analyses)
