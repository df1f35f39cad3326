"""ov_composition: a table keyed by pairs of heads (receiver, sender): how much a later head's
OV circuit composes with an earlier one's (V-composition, Elhage et al. 2021), from the weights:
||W_OV^s W_OV^r||_F / (||W_OV^s||_F ||W_OV^r||_F)."""

import pandas as pd
from ov_norms import ov_circuits  # the example package's other module

from headprobe.extend import (
    PAIR_KEYS,
    WEIGHTS_ONLY,
    Analysis,
    Cell,
    Paragraph,
    Section,
    Table,
    WeightsScorer,
    head_name,
    register,
)

NAME = "ov_composition"


class VCompositionScorer(WeightsScorer):
    analysis = NAME

    def compute(self, model, tokenizer, layers, stack, seed):
        circuits = ov_circuits(model, layers, stack)
        norms = {key: (w_v @ w_o).norm() for key, (w_v, w_o) in circuits.items()}
        rows = []
        for (layer, head), (v_r, o_r) in circuits.items():  # the receiver
            for (s_layer, s_head), (v_s, o_s) in circuits.items():  # an earlier sender
                if s_layer < layer:
                    # W_OV^s W_OV^r = V_s (O_s V_r) O_r: [d_model, d_model] through d_head
                    both = (v_s @ (o_s @ v_r) @ o_r).norm()
                    score = both / (norms[s_layer, s_head] * norms[layer, head])
                    rows.append((layer, head, s_layer, s_head, float(score)))
        return {"columns": [*PAIR_KEYS, "score"], "rows": rows}


def pairs(results):
    """The table `ov_composition_pairs`: one row per (receiver, sender), PAIR_KEYS and score."""
    kept = results.summary[NAME]
    table = pd.DataFrame(kept["rows"], columns=kept["columns"])
    return table.sort_values("score", ascending=False, kind="stable").reset_index(drop=True)


def section(results, name):
    top = results.table(f"{name}_pairs").head(5)
    rows = [
        [
            Cell(head_name(r.layer, r.head)),
            Cell(head_name(r.sender_layer, r.sender_head)),
            Cell(f"{r.score:.3f}", numeric=True),
        ]
        for r in top.itertuples()
    ]
    table = Table(
        f"{name}_top", "The five pairs that compose most", ["receiver", "sender", "score"], rows
    )
    return Section(
        name, "V-composition of pairs of heads", [Paragraph(__doc__.splitlines()[0]), table]
    )


ANALYSIS = register(
    Analysis(
        name=NAME,
        scorer=VCompositionScorer,
        input=WEIGHTS_ONLY,
        selection=False,
        default=False,
        description="V-composition of every pair of heads in different layers (weights only)",
        tables={f"{NAME}_pairs": pairs},
        report=section,
    )
)
