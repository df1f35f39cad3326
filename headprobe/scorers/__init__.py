"""One module per analysis, whole: its scorer, labels, baselines, role rule and tables, and its
report section beside it (`<analysis>_report.py`); `registry` says what each one declares."""
