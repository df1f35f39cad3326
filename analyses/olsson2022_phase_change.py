"""Olsson et al. (2022), "In-context Learning and Induction Heads": induction heads form in a
phase change, in the same window of training as a steep drop of the in-context loss.

The script trains a small decoder from scratch on the CPU (deterministic: fixed seeds, one
thread), saving `--checkpoints` checkpoints with their tokenizer, then runs the timeline on them
(METHODS §17; `headprobe timeline CKPT/step_* --probe repeated-random --length 32 --n 200
--analyses induction`) and states whether the induction heads' onset (the consecutive
checkpoints where the best head's `mul` score rises most) falls in the same interval as the
steepest drop of the repeated-half loss. Exit status 1 if not, or if the independent check
below disagrees with the timeline.

Model: 2 layers, 4 heads, width 64, GPT-NeoX (Pythia's architecture: a GPT-2-style decoder
with rotary positions; with GPT-2's learned absolute positions no previous-token head formed
within this budget), vocabulary of 64 random tokens plus one special. Data: sequences of 64
random tokens in which the first r tokens repeat at once (r drawn from 8..32 per sequence), so
the repeat's offset varies from sequence to sequence (with a fixed offset a positional head
solves it and no induction head forms). AdamW, lr 1e-3, batch 32; the loss is every next token.

Independent check (no headprobe code): on other random sequences (seed 1) every checkpoint's
eager attention gives each head's induction `mul` score (TransformerLens's pattern: the share of
a repeated-half row's attention on the token after the earlier occurrence of its token) and the
repeated-half loss; they must agree with the timeline's within 0.06 per head and within 0.15
nats (or 3.5 standard errors of the difference), and give the same induction onset.

    .venv/bin/python analyses/olsson2022_phase_change.py                  # about 2-5 minutes
    .venv/bin/python analyses/olsson2022_phase_change.py --steps 1500 --checkpoints 16

Outputs under --out (default out/olsson2022_phase_change/): checkpoints/step_XXXXX (the trained
series), timeline/ (the timeline, its report in timeline/report/), phase_change.csv / .md (per
checkpoint: best induction head and score, loss, the independent numbers).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _common as C

SCRIPT = "olsson2022_phase_change"
VOCAB, LENGTH, PROBE = 64, 64, 32  # tokens, training sequence length, probe's half length
WIDTH, LAYERS, HEADS = 64, 2, 4
SEED = 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1200, help="training steps (default 1200)")
    p.add_argument("--checkpoints", type=int, default=13, help="checkpoints saved, evenly spaced")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--n", type=int, default=200, help="probe sequences (default 200)")
    p.add_argument("--out", default=None, help="output directory (default: out/<script name>)")
    return p.parse_args(argv)


def tokenizer():
    """A word-level tokenizer of the tokens t0 ... t63 and one special (BOS/EOS/pad/unk)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = "<|endoftext|>"
    vocab = {f"t{k}": k for k in range(VOCAB)} | {special: VOCAB}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=special))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special,
        eos_token=special,
        unk_token=special,
        pad_token=special,
    )


def model():
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=VOCAB + 1,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * WIDTH,
        max_position_embeddings=LENGTH,
        rotary_pct=1.0,
        use_parallel_residual=False,
        bos_token_id=VOCAB,
        eos_token_id=VOCAB,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    return GPTNeoXForCausalLM(config)


def batch(generator, size: int = 32):
    """[size, LENGTH] random tokens whose first r repeat at once (r from 8 to 32 per row)."""
    import torch

    x = torch.randint(0, VOCAB, (size, LENGTH), generator=generator)
    for row, r in enumerate(torch.randint(8, PROBE + 1, (size,), generator=generator).tolist()):
        x[row, r : 2 * r] = x[row, :r]
    return x


def train(args, root: Path) -> list[str]:
    """Train, saving the model and tokenizer at evenly spaced steps (step 0 included)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same numbers on any machine
    try:
        return _train(args, root, torch)
    finally:
        torch.set_num_threads(threads)  # a caller's later work keeps its threads


def _train(args, root: Path, torch) -> list[str]:
    net, tok = model(), tokenizer()
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(SEED)
    saves = sorted(
        {round(k * args.steps / (args.checkpoints - 1)) for k in range(args.checkpoints)}
    )
    paths = []
    for step in range(args.steps + 1):
        if step in saves:
            path = root / f"step_{step:05d}"
            net.save_pretrained(path)
            tok.save_pretrained(path)
            paths.append(str(path))
        if step == args.steps:
            break
        x = batch(generator)
        logits = net(x).logits[:, :-1]  # [batch, position, vocab]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return paths


# ------------------------------------------------------------------------------ independent
def independent(path: str, n: int, seed: int = 1):
    """(mul [layer, head], loss, standard error of the loss) on `n` other probe sequences: eager
    attention and the next-token loss on the repeated half after its first token."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    half = torch.randint(0, VOCAB, (n, PROBE), generator=torch.Generator().manual_seed(seed))
    ids = torch.cat([half, half], 1)  # [n, 2 * PROBE]
    with torch.no_grad():
        out = net(ids, output_attentions=True)
    att = torch.stack(out.attentions, 1)  # [n, layer, head, query, key]
    t = ids.shape[1]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    before = ids[:, (j[0] - 1).clamp(min=0)]  # [n, key]: the token before key j
    pattern = (j >= 1) & (j - 1 < i) & (before[:, None, :] == ids[:, :, None])  # [n, q, k]
    rows = pattern.any(-1)  # [n, q]
    mass = (att * pattern[:, None, None]).sum(-1)  # [n, layer, head, q]
    mul = ((mass * rows[:, None, None]).sum((0, 3)) / rows.sum()).numpy()
    logp = torch.log_softmax(out.logits.double(), -1)  # [n, t, vocab]
    targets = torch.arange(PROBE + 1, 2 * PROBE)
    nll = -logp[:, targets - 1].gather(-1, ids[:, targets, None])[..., 0].mean(1).numpy()  # [n]
    return mul, float(nll.mean()), float(nll.std(ddof=1) / np.sqrt(n))


def onset(values) -> int:
    """The index k of the largest rise values[k + 1] - values[k]."""
    import numpy as np

    return int(np.argmax(np.diff(values)))


def compare(tl, paths: list[str], n: int):
    """Per checkpoint: the timeline's best induction head and score, its loss, the independent
    numbers; and the list of disagreements (empty when the timeline holds)."""
    import numpy as np
    import pandas as pd

    heads = tl.heads[(tl.heads["analysis"] == "induction") & (tl.heads["label"] == "mul")]
    objective = tl.objective.set_index("step")
    rows, problems = [], []
    for record, path in zip(tl.checkpoints, paths):
        step = record["step"]
        mine = heads[heads["step"] == step].pivot(index="layer", columns="head", values="score")
        mul, loss, se = independent(path, n)
        worst = float(np.abs(mine.to_numpy() - mul).max())
        got = objective.loc[step]
        se_mine = (got["ci_high"] - got["ci_low"]) / 3.92
        gap = abs(got["value"] - loss)
        if worst > 0.06:
            problems.append(f"step {step}: a head's mul differs by {worst:.3f} (> 0.06)")
        if gap > 0.15 and gap > 3.5 * np.hypot(se, se_mine):
            problems.append(f"step {step}: loss {got['value']:.3f} vs {loss:.3f} independent")
        best = np.unravel_index(np.nanargmax(mine.to_numpy()), mine.shape)
        rows.append(
            {
                "step": step,
                "best_head": f"{mine.index[best[0]]}-{mine.columns[best[1]]}",
                "mul": float(mine.to_numpy()[best]),
                "mul_independent": float(mul.max()),
                "max_head_difference": worst,
                "loss": float(got["value"]),
                "loss_low": float(got["ci_low"]),
                "loss_high": float(got["ci_high"]),
                "loss_independent": loss,
            }
        )
    table = pd.DataFrame(rows)
    for name, column in (("induction onset", "mul"), ("loss drop", "loss")):
        mine = onset(table[column] * (1 if column == "mul" else -1))
        theirs = onset(table[f"{column}_independent"] * (1 if column == "mul" else -1))
        if mine != theirs:
            problems.append(f"{name}: the independent check puts it at another interval")
    return table, problems


def main(argv=None) -> int:
    import headprobe

    args = parse_args(argv)
    out = C.out_dir(args, SCRIPT)
    started = time.perf_counter()
    paths = train(args, out / "checkpoints")
    trained = time.perf_counter() - started
    tl = headprobe.timeline(
        paths,
        out=str(out / "timeline"),
        probe="repeated-random",
        probe_length=PROBE,
        probe_n=args.n,
        analyses=["induction"],
        report=True,
    )
    table, problems = compare(tl, paths, args.n)
    C.write_table(
        table, out, "phase_change", "Induction heads and the repeated-half loss per checkpoint"
    )
    row = tl.onsets[(tl.onsets["analysis"] == "induction") & (tl.onsets["label"] == "mul")].iloc[0]
    print(
        f"\ninduction onset (best head's mul rises most): steps {row.from_step:,} -> {row.to_step:,}, "
        f"{row.rise:+.3f} [{row.rise_low:+.3f}, {row.rise_high:+.3f}]"
    )
    print(
        f"repeated-half loss falls most:                 steps {int(row.objective_from_step):,} -> "
        f"{int(row.objective_to_step):,}, {row.objective_fall:+.3f} nats "
        f"[{row.objective_fall_low:+.3f}, {row.objective_fall_high:+.3f}]"
    )
    same = bool(row.same_interval)
    print(
        f"same interval: {'yes' if same else 'no'} (Olsson et al.: the loss drops as induction heads form)"
    )
    for line in problems:
        print(f"independent check: {line}")
    print(
        f"\ntraining {trained:.0f} s, in all {time.perf_counter() - started:.0f} s; "
        f"report: {out / 'timeline' / 'report' / 'timeline.html'}"
    )
    return 0 if same and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
