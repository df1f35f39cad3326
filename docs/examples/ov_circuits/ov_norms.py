"""ov_norms: how much each head can write, read from its weights alone (no corpus, no pass):
the Frobenius norm of its OV circuit W_V^h W_O^h."""

import pandas as pd

from headprobe.extend import (
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

NAME = "ov_norms"


def ov_circuits(model, layers, stack):
    """{(layer, head): W_OV [d_model, d_model] as two factors (W_V [d_model, d_head], W_O
    [d_head, d_model])}: query head h reads key/value head h // (heads // kv_heads)."""
    from headprobe.extend import attention_sites, output_weight, value_weight  # torch: here only

    sites = attention_sites(model).of(stack)
    found = {}
    for layer in range(len(sites)) if layers is None else layers:
        w_v = value_weight(sites[layer]).detach().float()  # [kv_head, d_model, d_head]
        w_o = output_weight(sites[layer]).detach().float()  # [head, d_head, d_model]
        group = w_o.shape[0] // w_v.shape[0]
        for head in range(w_o.shape[0]):
            found[layer, head] = (w_v[head // group], w_o[head])
    return found


class OVNormScorer(WeightsScorer):
    analysis = NAME

    def compute(self, model, tokenizer, layers, stack, seed):
        """Called once, after the model loads; what it returns is kept in summary.json."""
        rows = {"layer": [], "head": [], "ov_norm": []}
        for (layer, head), (w_v, w_o) in ov_circuits(model, layers, stack).items():
            rows["layer"].append(layer)
            rows["head"].append(head)
            rows["ov_norm"].append(float((w_v @ w_o).norm()))  # ||W_V W_O||_F
        return rows


def heads(results):
    """The table `ov_norms_heads`: one row per head, largest norm first."""
    table = pd.DataFrame(results.summary[NAME])
    return table.sort_values("ov_norm", ascending=False, kind="stable").reset_index(drop=True)


def section(results, name):
    top = results.table(f"{name}_heads").head(5)
    rows = [
        [Cell(head_name(r.layer, r.head)), Cell(f"{r.ov_norm:.3f}", numeric=True)]
        for r in top.itertuples()
    ]
    about = Paragraph("The Frobenius norm of each head's OV circuit, from the weights alone.")
    table = Table(f"{name}_top", "The five heads with the largest OV norm", ["head", "norm"], rows)
    return Section(name, "OV circuit norms", [about, table])


ANALYSIS = register(
    Analysis(
        name=NAME,
        scorer=OVNormScorer,
        input=WEIGHTS_ONLY,  # no corpus: computed once from the weights
        selection=False,  # no best heads: nothing is counted
        default=False,
        description="the Frobenius norm of each head's OV circuit (weights only)",
        tables={f"{NAME}_heads": heads},
        report=section,
    )
)
