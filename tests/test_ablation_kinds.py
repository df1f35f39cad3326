"""Mean and resample ablation, and attribution patching, against hand computation (METHODS §8).

The answers are worked out here with forward hooks of the test's own on GPT-2's `c_proj` (the
attention output projection): the slices are captured from intact passes, replaced by hand, and
the loss of the probe's repeated half is summed with torch's cross-entropy."""

from __future__ import annotations

import re
from hashlib import blake2b

import pytest
import torch
import torch.nn.functional as F

from tests.test_gates import with_lm_head

N, LENGTH, HEADS = 6, 5, [(0, 1), (1, 2), (2, 0)]


def probe_rows(family):
    """The probe's sequences as the run feeds them: ids, sentence ids, and the scored pieces
    (the repeated half's word pieces, `meta["loss_words"]`), from the examples themselves."""
    from headprobe.inputs.batching import prepare
    from headprobe.inputs.probes import make_probe

    examples = list(
        make_probe("repeated-random", family.tokenizer, length=LENGTH, n=N, seed=0, vocab_size=None)
    )
    return probe_rows_of(prepare(examples, family.tokenizer, 512))


def projections(model):
    return [block.attn.c_proj for block in model.transformer.h]


def captured(model, ids):
    """[layer] -> [row, piece, hidden]: every layer's c_proj input in an intact pass."""
    found = {}
    hooks = [
        p.register_forward_pre_hook(lambda m, a, l=l: found.__setitem__(l, a[0].detach()))
        for l, p in enumerate(projections(model))
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return found


def losses(model, ids, keep, layer=None, head=None, baseline=None):
    """[row] the summed NLL of the scored pieces, with head `head` of `layer`'s slice set to
    `baseline` [row, piece, d_head] by a hook of this test's own."""
    d = model.config.n_embd // model.config.n_head
    hooks = []
    if layer is not None:

        def replace(module, args):
            x = args[0].clone()
            x[..., head * d : (head + 1) * d] = baseline
            return (x,)

        hooks.append(projections(model)[layer].register_forward_pre_hook(replace))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1]
    for h in hooks:
        h.remove()
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * keep[:, 1:]).sum(-1)


def partners(sent_ids):
    """METHODS §8: inputs of one length ordered by blake2b("0:resample:<sent_id>"), each one's
    partner the next (the last's the first)."""
    key = lambda s: int.from_bytes(
        blake2b(f"0:resample:{s}".encode(), digest_size=8).digest(), "little"
    )
    order = sorted(range(len(sent_ids)), key=lambda i: key(sent_ids[i]))
    return {order[k]: order[(k + 1) % len(order)] for k in range(len(order))}


@pytest.fixture(scope="module")
def run_kinds():
    import headprobe

    family, model = with_lm_head("gpt2")
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        probe="repeated-random",
        probe_n=N,
        probe_length=LENGTH,
        analyses=["ablation", "importance"],
        ablation="zero,mean,resample",
        estimate="michel,atp",
        heads=[f"{l}-{h}" for l, h in HEADS],
        n_boot=50,
        pictures=False,
        progress=False,
    )
    return family, model, results


def test_mean_and_resample_ablation_equal_the_slice_replaced_by_hand(run_kinds):
    family, model, results = run_kinds
    ids, sent_ids, keep = probe_rows(family)
    d = model.config.n_embd // model.config.n_head
    slices = captured(model, ids)
    intact = losses(model, ids, keep)
    pair = partners(sent_ids)
    table = results.ablation_heads
    assert set(table["ablation"]) == {"zero", "mean", "resample"}
    for layer, head in HEADS:
        cut = slice(head * d, (head + 1) * d)
        mean = slices[layer][..., cut].mean(0, keepdim=True).expand(N, -1, -1)  # per position
        other = slices[layer][[pair[i] for i in range(N)]][..., cut]
        zero = torch.zeros_like(mean)
        for kind, baseline in (("zero", zero), ("mean", mean), ("resample", other)):
            expected = (losses(model, ids, keep, layer, head, baseline) - intact).sum() / keep[
                :, 1:
            ].sum()
            row = table[
                (table.ablation == kind) & (table["layer"] == layer) & (table["head"] == head)
            ]
            assert len(row) == 1, (kind, layer, head)
            assert row["score"].iloc[0] == pytest.approx(float(expected), abs=2e-5, rel=1e-4)
    assert results.summary["ablation_ablation"]["resample_unpaired"] == 0


def test_zero_and_mean_have_a_paired_difference_per_head(run_kinds):
    _, _, results = run_kinds
    heads = results.ablation_heads
    kinds = results.ablation_kinds
    assert set(kinds["versus"]) == {"zero"} and set(kinds["ablation"]) == {"mean", "resample"}
    for r in kinds.itertuples():
        a = heads[
            (heads.ablation == r.ablation) & (heads.layer == r.layer) & (heads["head"] == r.head)
        ]
        z = heads[(heads.ablation == "zero") & (heads.layer == r.layer) & (heads["head"] == r.head)]
        assert r.difference == pytest.approx(a["score"].iloc[0] - z["score"].iloc[0], abs=1e-9)
        assert r.diff_low <= r.difference + 1e-12 <= r.diff_high + 2e-12


def test_atp_is_the_signed_first_order_estimate(run_kinds):
    """atp of kind k = sum over rows of (b - a) . dL/da at the head's slice, per scored piece;
    dL/da taken by this test from the c_proj inputs made leaves."""
    family, model, results = run_kinds
    ids, sent_ids, keep = probe_rows(family)
    d = model.config.n_embd // model.config.n_head
    slices = captured(model, ids)
    grads = {}

    def leaf(module, args, l):  # dL/da at every layer's c_proj input, every path kept
        args[0].register_hook(lambda g: grads.__setitem__(l, g))

    hooks = [
        p.register_forward_pre_hook(lambda m, a, l=l: leaf(m, a, l))
        for l, p in enumerate(projections(model))
    ]
    logits = model(input_ids=ids).logits[:, :-1]
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    (nll * keep[:, 1:]).sum().backward()
    for h in hooks:
        h.remove()
    pair = partners(sent_ids)
    table = results.importance_heads
    n = float(keep[:, 1:].sum())
    for layer in range(3):
        for head in range(4):
            cut = slice(head * d, (head + 1) * d)
            a, g = slices[layer][..., cut], grads[layer][..., cut]
            bases = {
                "zero": torch.zeros_like(a),
                "mean": a.mean(0, keepdim=True),
                "resample": a[[pair[i] for i in range(N)]],
            }
            for kind, b in bases.items():
                want = float(((b - a) * g).sum()) / n
                row = table[
                    (table.estimate == "atp")
                    & (table.ablation == kind)
                    & (table["layer"] == layer)
                    & (table["head"] == head)
                ]
                assert row["score"].iloc[0] == pytest.approx(want, abs=1e-5, rel=1e-4)
            michel = table[
                (table.estimate == "michel") & (table["layer"] == layer) & (table["head"] == head)
            ]
            per_row = (a * g).sum((1, 2)).abs().sum() / n  # |dL_x/dg| = |a . dL/da| per row
            assert michel["score"].iloc[0] == pytest.approx(float(per_row), abs=1e-5, rel=1e-4)


def test_importance_check_ablates_its_sample_exactly(run_kinds):
    _, _, results = run_kinds
    check = results.importance_check
    corr = results.importance_check_correlation
    assert set(check["by"]) == {"michel", "atp"}
    heads = results.ablation_heads
    for r in check.itertuples():  # the exact effect of a head is the same as the ablation's
        if (r.layer, r.head) in HEADS:
            same = heads[
                (heads.ablation == r.ablation)
                & (heads.layer == r.layer)
                & (heads["head"] == r.head)
            ]
            assert r.exact == pytest.approx(same["score"].iloc[0], abs=1e-5)
    assert len(check[(check.by == "michel")]) == 12  # 3 x 4 heads: all in top 10 + 10 random
    assert set(corr["by"]) == {"michel", "atp"} and corr["spearman"].between(-1, 1).all()


@pytest.mark.parametrize(
    "options, needle",
    [
        (dict(ablation="half"), "--ablation: half is not one of zero, mean, resample"),
        (dict(ablation="mean", analyses="dependency"), "--ablation is read by the"),
        (dict(estimate="atp", analyses="ablation"), "--estimate is read by the importance"),
        (dict(estimate="grad"), "--estimate: grad is not one of michel, atp, atp*"),
    ],
)
def test_kind_options_are_refused_in_one_line(options, needle):
    import headprobe
    from headprobe.core.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(needle)):
        headprobe.run(**options)


def test_resample_without_partner_is_refused_and_counted(tmp_path):
    """Sentences of distinct lengths: none has a partner of its length; the run says so."""
    import headprobe
    from headprobe.core.errors import UsageError

    family, model = with_lm_head("gpt2")
    words = ["the", "cat", "sat", "on", "the", "mat", "and", "dog"]
    lines = []
    for i in range(3):
        lines.append(f"# sent_id = s{i}")
        for j in range(i + 2):
            lines.append(
                f"{j + 1}\t{words[j]}\t{words[j]}\tX\t_\t_\t{j}\t{'root' if j == 0 else 'dep'}\t_\t_"
            )
        lines.append("")
    path = tmp_path / "t.conllu"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match="--ablation resample: no input has a partner"):
        headprobe.run(
            loaded=(model, family.tokenizer, "tiny"),
            treebank=path,
            analyses=["ablation"],
            ablation="resample",
            n_boot=20,
            pictures=False,
            progress=False,
        )


def test_atp_star_equals_one_forward_and_backward_per_dropped_layer():
    """AtP* as Kramar et al. write it, computed here the slow way: for each layer l, a forward
    pass whose block l outputs x + (y - x).detach() (hook of this test's own), one backward
    pass, |(0 - a) . dL/da| per row and head; the sum over l divided by L - 1."""
    from headprobe.inputs.batching import Batch, prepare
    from headprobe.inputs.probes import make_probe
    from headprobe.model.head_effects import graddrop_rows
    from headprobe.model.objectives import Objective

    family, model = with_lm_head("gpt2")
    examples = list(make_probe("repeated-random", family.tokenizer, length=LENGTH, n=3, seed=2))
    prepared = prepare(examples, family.tokenizer, 512)
    batch = Batch(prepared.examples, prepared.alignments, family.pad_id)
    objective = Objective.for_model(model, family.tokenizer)
    got, _ = graddrop_rows(model, batch, objective)  # [row, layer, head]
    ids, _, keep = probe_rows_of(prepared)
    d, blocks = model.config.n_embd // model.config.n_head, model.transformer.h
    want = torch.zeros_like(got)
    for dropped in range(len(blocks)):
        slices = {}

        def drop(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            new = args[0] + (out - args[0]).detach()
            return (new, *output[1:]) if isinstance(output, tuple) else new

        hooks = [blocks[dropped].register_forward_hook(drop)] + [
            p.register_forward_pre_hook(lambda m, a, l=l, s=slices: s.__setitem__(l, a[0]))
            for l, p in enumerate(projections(model))
        ]
        logits = model(input_ids=ids).logits[:, :-1]
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        layers = sorted(slices)
        grads = torch.autograd.grad(
            (nll * keep[:, 1:]).sum(), [slices[l] for l in layers], allow_unused=True
        )
        for h in hooks:
            h.remove()
        for l, g in zip(layers, grads):
            if g is None:
                continue
            a = slices[l].detach().unflatten(-1, (-1, d))  # [row, piece, head, d]
            want[:, l] += ((0 - a) * g.unflatten(-1, (-1, d))).sum((1, 3)).abs()
    want /= len(blocks) - 1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def probe_rows_of(prepared):
    ids = torch.tensor([a.input_ids for a in prepared.alignments])
    keep = torch.zeros_like(ids, dtype=torch.bool)
    for i, (example, a) in enumerate(zip(prepared.examples, prepared.alignments)):
        first, stop = example.meta["loss_words"]
        keep[i] = torch.tensor([first <= w < stop for w in a.piece_word])
    return ids, [e.sent_id for e in prepared.examples], keep


def test_retrieval_check_refuses_other_kinds():
    import headprobe
    from headprobe.core.errors import UsageError

    with pytest.raises(
        UsageError,
        match=re.escape("--ablation: retrieval_check (--retrieval-check) ablates by zero only"),
    ):
        headprobe.run(probe="needle", analyses="ablation", ablation="mean", retrieval_check=5)


def test_group_ablation_takes_the_first_kind():
    """Two heads set to their per-position means together, by hand, against `group_ablation`."""
    import headprobe

    family, model = with_lm_head("gpt2")
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        probe="repeated-random",
        probe_n=N,
        probe_length=LENGTH,
        analyses=["ablation"],
        heads=["0-0"],
        head_groups="pair=0-1,1-2",
        ablation="mean,zero",
        n_boot=50,
        pictures=False,
        progress=False,
    )
    ids, _, keep = probe_rows(family)
    d = model.config.n_embd // model.config.n_head
    slices = captured(model, ids)
    hooks = []
    for layer, head in ((0, 1), (1, 2)):
        cut = slice(head * d, (head + 1) * d)
        mean = slices[layer][..., cut].mean(0, keepdim=True)

        def replace(module, args, cut=cut, mean=mean):
            x = args[0].clone()
            x[..., cut] = mean
            return (x,)

        hooks.append(projections(model)[layer].register_forward_pre_hook(replace))
    gated = losses(model, ids, keep)
    for h in hooks:
        h.remove()
    change = float((gated - losses(model, ids, keep)).sum() / keep[:, 1:].sum())
    table = results.group_ablation
    row = table[table["group"] == "pair"]
    assert set(table["ablation"]) == {"mean"}
    assert row["change"].iloc[0] == pytest.approx(change, abs=2e-5, rel=1e-4)
