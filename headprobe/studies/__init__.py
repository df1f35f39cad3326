"""One folder per analysis, each whole: its scorer, labels, baselines, role rule, tables, report
section and derived views. Each is an entry point of the `headprobe.analyses` group
(pyproject.toml), which the registry loads (`headprobe.scoring.registry`)."""
