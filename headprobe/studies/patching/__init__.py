"""Heads on a task (METHODS §19): `analysis` (the `patching` analysis of a run: its scorer,
options, tables, task roles and `task_summary`), `node_effects` (every node patched exactly, the
direct effect, the estimates), `task_roles` (what the significant heads attend to, their roles),
`task_sums` (the per-unit sums the pass streams), `task_tables` (intervals, Holm, the check of
the estimates) and `report` (its console lines, report section and head cards)."""

from headprobe.studies.patching import analysis  # noqa: F401  (registers the analysis)
