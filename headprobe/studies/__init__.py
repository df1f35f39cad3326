"""One folder per analysis, each whole: its scorer, labels, baselines, role rule, tables, report
section and derived views. The registry finds them by discovery (`headprobe.scoring.registry`)."""
