"""Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits": an induction head
finds its target through a previous-token head's write in its keys (K-composition).

The script trains the 2-layer model of `olsson2022_phase_change.py` (its own training function,
deterministic, about a minute on the CPU), runs the composition (METHODS §18: every layer-0 head
a sender of every layer-1 head, channels q, k, v, mean ablation per position) on the
repeated-random probe, and states whether the best induction head's top key sender (the largest
drop of its induction attention when only its key reads the sender's mean) is the best
previous-token head, with the effect's 95% interval over probe sequences. Exit status 1 if not,
or if the interval does not exclude 0.

Then the same on the bundled SmolLM2 (the four strongest induction heads as receivers, every
earlier head a sender), and a check of a few edges against a direct hooked forward of the
eager model written here (the sender's slice of `o_proj`'s input replaced by its mean, the
receiver layer's own `q_proj`/`k_proj`/`v_proj` fed the changed, normed residual, the model's
own attention weights read): the pattern effects must agree within 1e-4. Exit status 1 if they
do not.

    .venv/bin/python analyses/elhage2021_composition.py                 # about 5-15 minutes
    .venv/bin/python analyses/elhage2021_composition.py --skip-smollm2  # the 2-layer model only

Outputs under --out (default out/elhage2021_composition/): edges_<model>.csv / .md (the key
edges into the best induction head(s), with intervals).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import _common as C
import olsson2022_phase_change as olsson

SCRIPT = "elhage2021_composition"
SMOL_N, SMOL_LENGTH, SMOL_RECEIVERS = 20, 50, 4
TOL = 1e-4


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1200, help="training steps (default 1200)")
    p.add_argument("--n", type=int, default=100, help="probe sequences, 2-layer model")
    p.add_argument("--trained", default=None, help="a saved 2-layer model (skip the training)")
    p.add_argument("--skip-smollm2", action="store_true", help="the 2-layer model only")
    p.add_argument("--out", default=None, help="output directory (default: out/<script name>)")
    return p.parse_args(argv)


def trained(steps: int, root: Path, path: str | None = None):
    """The Olsson script's model after `steps` steps (its `train`; or saved at `path`),
    eager attention."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path is None:
        path = olsson.train(SimpleNamespace(steps=steps, checkpoints=2, lr=1e-3), root)[-1]
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(path)


def run(model, tokenizer, n: int, length: int, receivers=None, batch_size: int = 10):
    """(edges table, role scores) of the composition on the repeated-random probe."""
    from headprobe.model.gates import head_means
    from headprobe.studies.composition.sweep import probe_batches
    from headprobe.studies.composition.tables import composition, role_score_table

    batches = probe_batches(model, tokenizer, length, n, batch_size)
    means = head_means(model, batches, per_position=True)  # [layer, piece, head, d_head]
    induction = role_names()[0]
    roles = lambda sums: {r: induction for _, r, _ in sums.edges}  # its induction attention
    frames = composition(model, batches, "mean", means, receivers, roles=roles)
    corr = frames["composition_check_correlation"]
    for r in corr.itertuples():
        print(
            f"first-order estimate against exact path patching, {r.edges} edges: Spearman "
            f"{r.spearman:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
            + (f"  WARNING: {r.warning}" if r.warning else "")
        )
    scores = role_score_table(frames["sums"])
    return frames["composition_edges"], scores, frames["sums"], batches, means


def clean_role_scores(model, tokenizer, n: int, length: int):
    """Role scores (clean attention shares) alone, to pick the receivers before the run."""
    from headprobe.model.gates import model_inputs
    from headprobe.model.layer_cache import clean_cache
    from headprobe.studies.composition import sweep

    batches = sweep.probe_batches(model, tokenizer, length, n, 10)
    got = {}
    for batch in batches:
        inputs = model_inputs(batch, None, model)
        cache = clean_cache(model, inputs)
        half = sweep.repeated_half(batch)
        rows = sweep.scored_rows(batch, half)
        roles = sweep.batch_roles(inputs["input_ids"], half)
        for name, v in sweep.clean_scores(model, cache, roles, rows).items():
            n_rows = (rows * (roles[name] >= 0)).sum().item()
            got[name] = got.get(name, 0) + v.sum(0) / n_rows / len(batches)
    return got  # name -> [layer, head]


def role_names():
    from headprobe.studies.induction.analysis import NAME as INDUCTION
    from headprobe.studies.previous_token.analysis import NAME as PREVIOUS_TOKEN

    return INDUCTION, PREVIOUS_TOKEN


def best(scores, role: str, k: int = 1, above: int = 0):
    """The k heads with the largest clean score of `role` (layers >= `above`)."""
    part = scores[(scores["role"] == role) & (scores["layer"] >= above)]
    return part.sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(k)


def key_senders(edges, receiver):
    """The key edges into `receiver`, largest role effect (induction drop) first."""
    l, h = receiver
    part = edges[(edges["layer"] == l) & (edges["head"] == h) & (edges["channel"] == "k")]
    return part.sort_values("role_effect", ascending=False)


def verdict(name: str, edges, scores, out: Path, receivers: int = 1) -> bool:
    """Print, for the best induction head(s), whether the top key sender is the best
    previous-token head, with the interval; True where every one is and excludes 0."""
    induction, previous = role_names()
    prev = best(scores, previous).iloc[0]
    prev_head = (int(prev["layer"]), int(prev["head"]))
    print(
        f"\n{name}: best previous-token head {prev_head[0]}-{prev_head[1]} (share {prev.score:.3f})"
    )
    ok, rows = True, []
    for r in best(scores, induction, receivers, above=1).itertuples():
        part = key_senders(edges, (r.layer, r.head))
        top = part.iloc[0]
        sender = (int(top.sender_layer), int(top.sender_head))
        same = sender == prev_head
        excludes = bool(top.role_effect_low > 0)
        ok &= same and excludes
        print(
            f"  induction head {r.layer}-{r.head} (share {r.score:.3f}): top key sender "
            f"{sender[0]}-{sender[1]}, drop of induction attention {top.role_effect:.3f} "
            f"[{top.role_effect_low:.3f}, {top.role_effect_high:.3f}] "
            f"(of {r.score:.3f}); the best previous-token head: {'yes' if same else 'NO'}"
        )
        rows.append(part.head(5))
    import pandas as pd

    C.write_table(
        pd.concat(rows), out, f"edges_{name}", f"Key edges into the induction heads, {name}"
    )
    return ok


def main(argv=None) -> int:
    args = parse_args(argv)
    out = C.out_dir(args, SCRIPT)
    started = time.perf_counter()
    import torch

    torch.manual_seed(0)
    model, tokenizer = trained(args.steps, out / "checkpoints", args.trained)
    edges, scores, *_ = run(model, tokenizer, args.n, olsson.PROBE)
    found = verdict("olsson-2layer", edges, scores, out)
    print(
        f"textbook K-composition found: {'yes' if found else 'no'} ({time.perf_counter() - started:.0f} s)"
    )
    agree = True
    if not args.skip_smollm2:
        agree = smollm2(out)
    return 0 if found and agree else 1


def smollm2(out: Path) -> bool:
    """The same on SmolLM2, and a few edges against a direct hooked forward."""
    import numpy as np

    from headprobe.model.loading import load_lm

    model, tokenizer, display, _ = load_lm("smollm2", attn_implementation="eager")
    induction = clean_role_scores(model, tokenizer, SMOL_N, SMOL_LENGTH)[role_names()[0]]
    induction[0] = -1  # the first layer has no senders
    top = np.argsort(-induction, axis=None, kind="stable")[:SMOL_RECEIVERS]
    receivers = [tuple(int(i) for i in np.unravel_index(k, induction.shape)) for k in top]
    edges, scores, sums, batches, means = run(model, tokenizer, SMOL_N, SMOL_LENGTH, receivers)
    verdict("smollm2", edges, scores, out, SMOL_RECEIVERS)
    picked = edges.sort_values("pattern_effect", ascending=False).head(3)
    worst = 0.0
    for r in picked.itertuples():
        want = hooked_pattern(
            model, batches, means, (r.sender_layer, r.sender_head), (r.layer, r.head), r.channel
        )
        worst = max(worst, abs(want - r.pattern_effect))
        print(
            f"  hooked check {r.sender_layer}-{r.sender_head} -> {r.layer}-{r.head} {r.channel}: "
            f"{r.pattern_effect:.6f} vs {want:.6f}"
        )
    print(
        f"hooked forward agrees within {TOL}: {'yes' if worst <= TOL else 'NO'} (worst {worst:.2e})"
    )
    return bool(np.isfinite(worst) and worst <= TOL)


def hooked_pattern(model, batches, means, sender, receiver, channel: str) -> float:
    """Total variation of the receiver's attention rows (repeated half), averaged over rows,
    when only its layer's `channel` projection reads the residual with the sender's slice of
    `o_proj`'s input replaced by its mean: eager SmolLM2 (Llama) modules and hooks only."""
    import torch

    from headprobe.inputs.align import WORD

    (ls, hs), (lr, hr) = sender, receiver
    layers = model.model.layers
    s_attn, r_layer = layers[ls].self_attn, layers[lr]
    d = s_attn.head_dim
    proj = getattr(r_layer.self_attn, f"{channel}_proj")
    total, count = 0.0, 0.0
    for batch in batches:
        kept = {}
        h1 = s_attn.o_proj.register_forward_pre_hook(lambda m, a, k=kept: k.update(z=a[0]))
        h2 = r_layer.input_layernorm.register_forward_pre_hook(
            lambda m, a, k=kept: k.update(x=a[0])
        )
        with torch.no_grad():
            out0 = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                output_attentions=True,
            )
        h1.remove(), h2.remove()
        z = kept["z"].clone()
        z[..., hs * d : (hs + 1) * d] = means[ls, :, hs].to(z)  # [piece, d_head] per position
        with torch.no_grad():
            change = s_attn.o_proj(z) - s_attn.o_proj(kept["z"])
            new = proj(r_layer.input_layernorm(kept["x"] + change))
        h3 = proj.register_forward_hook(lambda m, a, o, new=new: new)
        with torch.no_grad():
            out1 = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                output_attentions=True,
            )
        h3.remove()
        p0, p1 = out0.attentions[lr][:, hr].float(), out1.attentions[lr][:, hr].float()
        tv = 0.5 * (p1 - p0).abs().sum(-1)  # [batch, query]
        word, kind = batch.piece_word, batch.piece_kind
        rows = (kind == WORD) & (word >= SMOL_LENGTH)  # the repeated half's word pieces
        total += float((tv * rows).sum())
        count += float(rows.sum())
    return total / count


if __name__ == "__main__":
    sys.exit(main())
