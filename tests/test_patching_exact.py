"""Heads on a task, exact (METHODS §19): noising, denoising and the direct effect of a node equal
a hooked forward of the real model's own modules, on every family of the interface path that
has a language-model head (a causal LM for decoders, a masked LM for encoders).

The reference is built here, independently of `model.task_nodes` and the study: one full forward
of the whole model per node (no shared prefix, no replayed layers, no batching of nodes, the full
vocabulary's logits), with a hook on the node's own module that puts the other prompt's value
in; the direct effect's reference adds the node's write change, computed from the modules
(the output projection run on the changed slices; Gemma's norm on the attention output where the
family has one, and the one on the MLP's output), to the final norm's input at the scored piece.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers as tf
from test_architectures import CASES, FALCON_LEGACY, build
from test_composition import WRITE_NORMS

from headprobe.core.errors import UsageError
from headprobe.model.discovery import attention_sites
from headprobe.model.mlp_writes import mlp_modules
from headprobe.model.projections import features_last
from headprobe.model.task_nodes import TaskNodes
from headprobe.studies.patching.node_effects import TaskPairs, direct_effects, exact_effects

TOL = 1e-5
LEGACY = {"deberta-v2", "mpnet", "bloom-alibi", "squeezebert"} | FALCON_LEGACY
ENCODER_DECODER = {"t5", "t5-encoder"}  # refused: a task's prompt is one sequence
FAMILIES = sorted({name for name, _ in CASES} - LEGACY - ENCODER_DECODER)
SHARED = {"albert"}  # one layer module called several times: refused
NO_DIRECT = {  # the final residual stream is no sum of writes, or no final norm is found
    "bart", "bert", "distilbert", "electra", "opt", "roberta", "xlm-roberta",
}  # fmt: skip
ROWS, PIECES, CHANGED = 3, 7, 3
MLP_NORMS = {name: "layers.0.post_feedforward_layernorm" for name in WRITE_NORMS}  # Gemma-2/3


def lm_of(name: str):
    """The family's tiny model under a language-model head: masked for encoders, else causal."""
    built = build(name)
    decoder = "decoder" in attention_sites(built.model).stacks  # BART: its decoder alone
    cls = tf.AutoModelForCausalLM if decoder else tf.AutoModelForMaskedLM
    torch.manual_seed(0)
    model = cls.from_config(built.model.config, attn_implementation="eager").eval()
    return built, model, attention_sites(model).of(None)[0].causal


def pairs_for(built, causal: bool, vocab: int) -> TaskPairs:
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(5, min(vocab, 60), (ROWS, PIECES), generator=g)
    corrupted = clean.clone()
    corrupted[:, CHANGED] = torch.randint(5, min(vocab, 60), (ROWS,), generator=g)
    position = torch.full((ROWS,), PIECES - 1)
    if not causal:  # a masked LM is scored at its mask token
        mask = built.tokenizer.mask_token_id or 4  # the test tokenizers may have none
        clean[:, PIECES - 2] = corrupted[:, PIECES - 2] = mask
        position[:] = PIECES - 2
    return TaskPairs(clean, corrupted, torch.tensor([[7, 9]] * ROWS), position)


def full_metric(model, ids, pairs, hooks=()) -> torch.Tensor:
    """[row]: logit[answer] - logit[distractor] at the scored piece, a full forward with `hooks`
    ((module, kind, fn) registered for it alone)."""
    handles = []
    for module, kind, fn in hooks:
        register = (
            module.register_forward_pre_hook if kind == "pre" else module.register_forward_hook
        )
        handles.append(register(fn))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits  # [row, piece, vocab]
    finally:
        for h in handles:
            h.remove()
    rows = torch.arange(ids.shape[0])
    at = logits[rows, pairs.position]  # [row, vocab]
    return at[rows, pairs.targets[:, 0]] - at[rows, pairs.targets[:, 1]]


def node_modules(model):
    sites = attention_sites(model).of(None)
    return sites, [s.output for s in sites], mlp_modules(model, sites[0].stack)


def recorded(model, ids):
    """Every node's value in a plain forward on `ids`: slices, MLP outputs, embeddings."""
    sites, outputs, mlps = node_modules(model)
    got = {"slice": {}, "mlp": {}}
    hooks = []
    for layer, (out, mlp) in enumerate(zip(outputs, mlps)):
        hooks.append((out, "pre", lambda m, a, l=layer: got["slice"].__setitem__(l, a[0].clone())))
        hooks.append((mlp, "post", lambda m, a, o, l=layer: got["mlp"].__setitem__(l, first(o))))
    embed = model.get_input_embeddings()
    hooks.append((embed, "post", lambda m, a, o: got.__setitem__("embed", o.clone())))
    full_metric(model, ids, _AnyPairs(ids), hooks)
    return got


def first(output) -> torch.Tensor:
    """A module's output tensor (gpt-oss's MLP returns it with its router's scores)."""
    return (output[0] if isinstance(output, tuple) else output).clone()


class _AnyPairs:
    def __init__(self, ids):
        self.position = torch.zeros(ids.shape[0], dtype=torch.long)
        self.targets = torch.zeros(ids.shape[0], 2, dtype=torch.long)


def patch_hook(model, node, source):
    """(module, kind, fn) putting `source`'s value of `node` in: ("head", l, h), ("mlp", l),
    ("embed",)."""
    sites, outputs, mlps = node_modules(model)
    if node[0] == "head":
        _, layer, head = node
        d = sites[layer].d_head
        module = outputs[layer]

        def put(m, a):
            z = features_last(m, a[0]).clone()
            z[..., head * d : (head + 1) * d] = features_last(m, source["slice"][layer])[
                ..., head * d : (head + 1) * d
            ]
            return (features_last(m, z), *a[1:])

        return module, "pre", put
    if node[0] == "mlp":
        src = source["mlp"][node[1]]
        return mlps[node[1]], "post", lambda m, a, o: (src, *o[1:]) if isinstance(o, tuple) else src
    return model.get_input_embeddings(), "post", lambda m, a, o: source["embed"]


def sample_nodes(nodes: TaskNodes):
    rng = random.Random(5)
    heads = [(l, h) for l in range(nodes.n_layers) for h in range(nodes.n_heads)]
    picked = [("head", l, h) for l, h in rng.sample(heads, min(5, len(heads)))]
    return picked + [("mlp", rng.randrange(nodes.n_layers)), ("embed",)]


def column(nodes: TaskNodes, node) -> int:
    name = {"head": lambda: f"{node[1]}-{node[2]}", "mlp": lambda: f"mlp {node[1]}"}.get(
        node[0], lambda: "embed"
    )()
    return nodes.names().index(name)


@pytest.mark.parametrize("name", FAMILIES)
def test_noising_and_denoising_equal_a_hooked_forward(name):
    built, model, causal = lm_of(name)
    if name in SHARED:
        with pytest.raises(UsageError, match="share modules"):
            TaskNodes(model)
        return
    nodes = TaskNodes(model)
    pairs = pairs_for(built, causal, model.config.vocab_size)
    got = exact_effects(model, nodes, pairs)
    assert got.prefix == (CHANGED if causal else 0)  # the shared prefix runs once (causal)
    clean, corrupted = recorded(model, pairs.clean), recorded(model, pairs.corrupted)
    m_clean = full_metric(model, pairs.clean, pairs)
    m_corrupted = full_metric(model, pairs.corrupted, pairs)
    torch.testing.assert_close(got.m_clean, m_clean, atol=TOL, rtol=1e-4)
    torch.testing.assert_close(got.m_corrupted, m_corrupted, atol=TOL, rtol=1e-4)
    moved = 0.0
    for node in sample_nodes(nodes):
        c = column(nodes, node)
        noised = full_metric(model, pairs.clean, pairs, [patch_hook(model, node, corrupted)])
        denoised = full_metric(model, pairs.corrupted, pairs, [patch_hook(model, node, clean)])
        torch.testing.assert_close(got.noise[:, c], m_clean - noised, atol=TOL, rtol=1e-4)
        torch.testing.assert_close(got.denoise[:, c], denoised - m_corrupted, atol=TOL, rtol=1e-4)
        moved += float((m_clean - noised).abs().sum())
    assert moved > 1e-4  # the sample's patches change the metric: the check can fail


def write_change(model, name, nodes, node, clean, corrupted, pairs) -> torch.Tensor:
    """[row, hidden]: the node's write change at the scored piece, clean to corrupted, from the
    modules themselves (module docstring)."""
    rows, at = torch.arange(ROWS), pairs.position
    sites, outputs, mlps = node_modules(model)
    if node[0] == "mlp":
        before, after = clean["mlp"][node[1]], corrupted["mlp"][node[1]]
        if name in MLP_NORMS:
            norm = model.get_submodule(f"model.{MLP_NORMS[name].replace('0', str(node[1]), 1)}")
            with torch.no_grad():
                before, after = norm(before), norm(after)
        return (after - before)[rows, at]
    _, layer, head = node
    d = sites[layer].d_head
    z = clean["slice"][layer].clone()
    z[..., head * d : (head + 1) * d] = corrupted["slice"][layer][..., head * d : (head + 1) * d]
    with torch.no_grad():
        before, after = outputs[layer](clean["slice"][layer]), outputs[layer](z)
        if name in WRITE_NORMS:
            norm = model.get_submodule(f"model.{WRITE_NORMS[name].replace('0', str(layer), 1)}")
            before, after = norm(before), norm(after)
    return (after - before)[rows, at]


@pytest.mark.parametrize("name", [n for n in FAMILIES if n not in SHARED])
def test_direct_effect_equals_a_hooked_final_norm(name):
    built, model, causal = lm_of(name)
    nodes = TaskNodes(model)
    pairs = pairs_for(built, causal, model.config.vocab_size)
    got = direct_effects(model, nodes, pairs, exact_effects(model, nodes, pairs))
    if name in NO_DIRECT:
        assert got is None
        return
    clean, corrupted = recorded(model, pairs.clean), recorded(model, pairs.corrupted)
    m_clean = full_metric(model, pairs.clean, pairs)
    rows = torch.arange(ROWS)
    moved = 0.0
    for node in sample_nodes(nodes):
        if node[0] == "embed":
            continue  # below: the embeddings through the residual stream entering layer 0
        change = write_change(model, name, nodes, node, clean, corrupted, pairs)

        def add(m, a, change=change):
            x = a[0].clone()
            x[rows, pairs.position] += change.to(x.dtype)
            return (x, *a[1:])

        want = m_clean - full_metric(model, pairs.clean, pairs, [(nodes.final, "pre", add)])
        c = column(nodes, node)
        torch.testing.assert_close(got["direct"][:, c], want, atol=TOL, rtol=1e-4)
        torch.testing.assert_close(
            got["direct_answer"][:, c] + got["direct_distractor"][:, c], got["direct"][:, c]
        )
        moved += float(want.abs().sum())
    assert moved > 1e-4
