"""Head ablation on every family the capture supports, each stack of an encoder-decoder.

`headprobe.run(..., analyses=["ablation"], heads="all")` on the tiny random model of every
family of tests/test_architectures.py (ALBERT's one shared layer, the legacy-path families
DeBERTa-v2, MPNet, BLOOM, Falcon, SqueezeBERT (grouped pointwise convolutions, channels
first) and the fused projections included), and on the encoder,
decoder and cross-attention stacks of T5 and BART, must give a per-head table: every head
of every layer, finite, with effects that differ from head to head.

The models' value and output projections (found through their attention sites, as the gates
find them) are redrawn large, so that a head's output is not drowned by the residual stream
(with the default init, 0.02, a post-norm model's 1 - cos changes by ~1e-8, float noise).
Each run reads two short sentences.

And the ablation is per call of a shared module: gating ALBERT's layer 0 only changes the
model as zeroing the shared projection's head slice for the first call alone would.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from test_architectures import FAMILIES, build

import headprobe
from headprobe.model.discovery import attention_sites
from headprobe.model.gates import HeadGates

CASES = [(name, stack) for name, (_, _, _, stacks) in FAMILIES.items() for stack in stacks]
TREEBANK = """# sent_id = s1
1\tthe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\t_
4\ton\ton\tADP\t_\t_\t6\tcase\t_\t_
5\tthe\tthe\tDET\t_\t_\t6\tdet\t_\t_
6\tmat\tmat\tNOUN\t_\t_\t3\tobl\t_\t_

# sent_id = s2
1\ta\ta\tDET\t_\t_\t3\tdet\t_\t_
2\tbig\tbig\tADJ\t_\t_\t3\tamod\t_\t_
3\tdog\tdog\tNOUN\t_\t_\t4\tnsubj\t_\t_
4\tran\trun\tVERB\t_\t_\t0\troot\t_\t_

"""


def loud(name: str) -> torch.nn.Module:
    """A copy of the family's model with every site's value and output projection redrawn
    N(0, 1 / in_features) (unit gain): heads that matter to the output (a convolution's
    in_features: its weight's [in / groups, kernel] per output channel)."""
    model = copy.deepcopy(build(name).model)
    torch.manual_seed(7)
    with torch.no_grad():
        for site in attention_sites(model).sites:
            for projection in (site.value, site.output):
                if projection is not None:
                    weight = projection.weight
                    fan_in = weight[0].numel() if weight.dim() == 3 else min(weight.shape)
                    weight.normal_(0.0, 1.0 / math.sqrt(fan_in))
    return model


@pytest.fixture(scope="module")
def treebank(tmp_path_factory):
    path = tmp_path_factory.mktemp("ablation") / "two.conllu"
    path.write_text(TREEBANK)
    return str(path)


@pytest.mark.parametrize("name,stack", CASES)
def test_ablation_all_heads_every_family(name, stack, treebank):
    built = build(name)
    results = headprobe.run(
        loaded=(loud(name), built.tokenizer, name),
        treebank=treebank,
        analyses=["ablation"],
        heads="all",
        stack=stack,
        n_boot=10,
        progress=False,
        device="cpu",
    )
    table = results.ablation_heads
    assert sorted(zip(table["layer"], table["head"])) == [
        (l, h) for l in range(2) for h in range(4)
    ]
    scores = table["score"].to_numpy(np.float64)
    assert np.isfinite(scores).all(), (name, stack, scores)
    assert scores.max() - scores.min() > 1e-3, (name, stack, scores)  # float noise is ~1e-7
    assert len(np.unique(scores.round(6))) >= 4, (name, stack, scores)


def test_shared_layer_gates_one_call():
    """ALBERT runs one layer module twice: gating head 1 of layer 0 must equal zeroing head 1's
    slice of the shared output projection during the first call only, and differ from layer 1's."""
    model = loud("albert")
    tok = build("albert").tokenizer
    inputs = tok(["the cat sat on the mat"], return_tensors="pt")
    site = attention_sites(model).sites[0]
    projection = site.output
    calls = [0]

    def zero_first_call(module, args):
        calls[0] += 1
        if calls[0] == 1:
            x = args[0].clone()  # [batch, piece, head * d_head]
            x[..., 8:16] = 0.0
            return (x,)
        return None

    with torch.no_grad():
        handle = projection.register_forward_pre_hook(zero_first_call)
        try:
            expected = model(**inputs).last_hidden_state
        finally:
            handle.remove()
        layer0, layer1 = torch.ones(2, 4), torch.ones(2, 4)
        layer0[0, 1] = 0.0
        layer1[1, 1] = 0.0
        with HeadGates(model, layer0):
            got = model(**inputs).last_hidden_state
            again = model(**inputs).last_hidden_state  # the call count starts again each pass
        with HeadGates(model, layer1):
            other = model(**inputs).last_hidden_state
    assert calls[0] == 2
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(again, expected, atol=1e-6, rtol=0)
    assert (other - expected).abs().max().item() > 1e-3


# -- every input kind ------------------------------------------------------------------------
def test_ablation_on_the_probe_counts_the_repeated_half():
    """`--probe repeated-random --analyses ablation --heads 1-2`: the effect is the change in the
    next-token loss on the repeated half (words length+1 .. 2 length - 1), computed here by hand
    on a copy whose output projection has head 1-2's columns zeroed."""
    from test_gates import with_lm_head, zero_columns

    from headprobe.core.seeds import SEED
    from headprobe.inputs.probes import make_probe

    family, model = with_lm_head("llama")
    length, n = 6, 4
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny llama"),
        probe="repeated-random",
        probe_length=length,
        probe_n=n,
        analyses=["ablation"],
        heads="1-2",
        n_boot=10,
        progress=False,
    )
    table = results.ablation_heads
    assert list(zip(table["layer"], table["head"])) == [(1, 2)]
    assert table["n"].tolist() == [n * (length - 1)]
    assert "repeated half" in results.summary["objectives"]["ablation"]
    examples = list(make_probe("repeated-random", family.tokenizer, length=length, n=n, seed=SEED))
    ids = torch.tensor([example.meta["input_ids"] for example in examples])  # [seq, piece]
    first = ids.shape[1] - 2 * length  # the specials in front (the BOS)
    targets = torch.arange(first + length + 1, first + 2 * length)  # the repeated half's pieces

    def loss(net) -> float:
        with torch.no_grad():
            logits = net(input_ids=ids).logits  # [seq, piece, vocab]
        nll = torch.nn.functional.cross_entropy(
            logits[:, targets - 1].transpose(1, 2), ids[:, targets], reduction="sum"
        )
        return float(nll) / (n * len(targets))

    expected = loss(zero_columns(model, [(1, 2)], 8)) - loss(model)
    assert abs(table["score"][0] - expected) < 1e-4, (table["score"][0], expected)


def test_ablation_on_coreference_windows():
    """Only coreference windows given: ablation reads them (no sentence corpus to fall back on)."""
    from headprobe.inputs.samples import SAMPLE_COREF

    results = headprobe.run(
        loaded=(loud("bert"), build("bert").tokenizer, "tiny bert"),
        coref=str(SAMPLE_COREF),
        analyses=["ablation"],
        heads="0-1,1-2",
        n_boot=10,
        progress=False,
    )
    table = results.ablation_heads
    assert list(zip(table["layer"], table["head"])) == [(0, 1), (1, 2)]
    assert np.isfinite(table["score"]).all() and (table["score"] > 1e-3).all()
    assert results.summary["runs"]["coreference"]["examples"] > 0
