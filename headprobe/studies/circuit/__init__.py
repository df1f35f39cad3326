"""Circuits on a task (METHODS §20): `analysis` (the `circuit` analysis of a run: its scorer,
tables and registration), `edge_scores` (every edge scored by EAP and EAP-IG, circuits and
single edges evaluated exactly on a batch), `curves` (budgets, faithfulness, CPR and CMD, the
smallest faithful circuit) and `report` (its console lines and report section). The graph:
`headprobe.model.edge_graph`; where the forward's receiver inputs are built:
`headprobe.model.circuit_forward`."""

from headprobe.studies.circuit import analysis  # noqa: F401  (registers the analysis)
