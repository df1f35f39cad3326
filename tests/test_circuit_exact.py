"""Circuits on a task, exact (METHODS §20): m(C), the exact path patching of one edge and the
edges' gradients equal a hooked forward of the real model's own modules, on every family of the
interface path whose residual stream is a sum of writes; the others are refused in one line.

The reference is built here, independently of `model.circuit_forward`: one full forward of the
whole model (no shared prefix, no copies, no routed attention function), with hooks on the
family's own modules, named below per family: the norm before the attention records the
residual stream x; the output projection's input and the MLP's output record this forward's
writes (a head's write is the output projection run on its slice alone, less the projection of
zeros); the query, key and value projections' outputs get, in each head's slice, the projection
of the norm of x + sum over its out-of-circuit senders of (corrupted write - write here); the
MLP gets its norm of its residual stream changed the same way; the final norm's input likewise.
Where heads share a key/value group, the circuits drawn here give the heads of a group the same
key and value edges (the projection's output holds one key per group); a separate test checks
that a key edge into one head of a group changes that head alone.
"""

from __future__ import annotations

import pytest
import torch
from test_patching_exact import FAMILIES, full_metric, lm_of, pairs_for

from headprobe.core.errors import UsageError
from headprobe.model.edge_graph import EdgeGraph
from headprobe.model.task_nodes import TaskNodes
from headprobe.studies.circuit import edge_scores as es

TOL = 1e-5
LLAMA_LIKE = dict(
    blocks="model.layers",
    norm="input_layernorm",
    mlp_norm="post_attention_layernorm",
    mlp="mlp",
    out="self_attn.o_proj",
    final="model.norm",
    proj={c: (f"self_attn.{c}_proj", "separate") for c in "qkv"},
    sequential=True,
)
# where each family's modules are, and how its fused projection lays out q, k and v
LAYOUT = {
    "llama-gqa": LLAMA_LIKE,
    "mistral-window": LLAMA_LIKE,
    "qwen2": LLAMA_LIKE,
    "qwen3": LLAMA_LIKE,
    "gpt-oss-sinks": LLAMA_LIKE,
    "phi3": {**LLAMA_LIKE, "proj": {c: ("self_attn.qkv_proj", "phi3") for c in "qkv"}},
    "gpt2": dict(
        blocks="transformer.h",
        norm="ln_1",
        mlp_norm="ln_2",
        mlp="mlp",
        out="attn.c_proj",
        final="transformer.ln_f",
        proj={c: ("attn.c_attn", "gpt2") for c in "qkv"},
        sequential=True,
    ),
    "gpt-neox": dict(
        blocks="gpt_neox.layers",
        norm="input_layernorm",
        mlp_norm="post_attention_layernorm",
        mlp="mlp",
        out="attention.dense",
        final="gpt_neox.final_layer_norm",
        proj={c: ("attention.query_key_value", "neox") for c in "qkv"},
        sequential=False,
    ),
    "falcon-alibi": dict(
        blocks="transformer.h",
        norm="input_layernorm",
        mlp_norm="input_layernorm",
        mlp="mlp",
        out="self_attention.dense",
        final="transformer.ln_f",
        proj={c: ("self_attention.query_key_value", "falcon") for c in "qkv"},
        sequential=False,
    ),
}
REFUSED = {  # post-norm, a norm after a sublayer, or layers that share modules
    "albert", "bart", "bert", "distilbert", "electra", "gemma2-softcap", "gemma3", "modernbert",
    "opt", "roberta", "xlm-roberta",
}  # fmt: skip


def test_every_family_is_covered():
    assert set(FAMILIES) == set(LAYOUT) | REFUSED


def channel_slice(layout: str, channel: str, head: int, heads: int, kv: int, d: int) -> slice:
    """Features of a (fused) projection's output that hold `channel` of query head `head` (its
    key/value group's for k and v)."""
    group = head // (heads // kv)
    if layout == "separate":
        h = head if channel == "q" else group
        return slice(h * d, (h + 1) * d)
    if layout == "gpt2":
        start = "qkv".index(channel) * heads * d
        return slice(start + head * d, start + (head + 1) * d)
    if layout == "phi3":
        if channel == "q":
            return slice(head * d, (head + 1) * d)
        start = heads * d + (0 if channel == "k" else kv * d)
        return slice(start + group * d, start + (group + 1) * d)
    if layout == "neox":
        start = head * 3 * d + "qkv".index(channel) * d
        return slice(start, start + d)
    if layout == "falcon":  # multi-query: [heads x q, k, v]
        if channel == "q":
            return slice(head * d, (head + 1) * d)
        start = (heads + (0 if channel == "k" else 1)) * d
        return slice(start, start + d)
    raise ValueError(layout)


def plain(module, x):
    """A module's own forward, without the hooks this reference puts on it."""
    return type(module).forward(module, x)


class Reference:
    """The hooked forward of the module docstring for one family's model."""

    def __init__(self, name, model, graph: EdgeGraph):
        self.spec, self.model, self.graph = LAYOUT[name], model, graph
        cfg = model.config.get_text_config()
        self.heads = cfg.num_attention_heads
        self.kv = getattr(cfg, "num_key_value_heads", None) or self.heads
        if name == "falcon-alibi":
            self.kv = 1
        self.d = graph.nodes.d_head
        self.blocks = model.get_submodule(self.spec["blocks"])

    def sub(self, layer, path):
        return self.blocks[layer].get_submodule(path)

    def head_writes(self, layer, z):
        """[head, batch, piece, hidden] from the output projection's input z [batch, piece, H*d]."""
        out = self.sub(layer, self.spec["out"])
        zero = plain(out, torch.zeros_like(z))
        got = []
        for h in range(self.heads):
            only = torch.zeros_like(z)
            only[..., h * self.d : (h + 1) * self.d] = z[..., h * self.d : (h + 1) * self.d]
            got.append(plain(out, only) - zero)
        return torch.stack(got)

    def run(self, ids, pairs, corrupted=None, out=None, leaf=None):
        """m [row]: the forward on `ids`; with `corrupted` (this class's `writes`) and `out`
        [receiver, sender], the circuit's; `leaf`: (receiver, tensor) added to that receiver's
        input (for its gradient)."""
        g, spec, handles = self.graph, self.spec, []
        here = {}  # sender index -> write [batch, piece, hidden]
        xs = {}

        def change(r, x):
            total = x
            if out is not None:
                for s in torch.nonzero(out[r] > 0)[:, 0].tolist():
                    total = total + corrupted[s] - here[s]
            if leaf is not None and leaf[0] == r:
                total = total + leaf[1]
            return total

        def norm_hook(layer):
            def hook(module, args):
                if layer not in xs:
                    xs[layer] = args[0]
                    if layer == 0:
                        here[0] = args[0]

            return hook

        def out_hook(layer):
            def hook(module, args):
                writes = self.head_writes(layer, args[0])
                for h in range(self.heads):
                    here[1 + layer * (self.heads + 1) + h] = writes[h]

            return hook

        def mlp_out(layer):
            def hook(module, args, output):
                out = output[0] if isinstance(output, tuple) else output  # gpt-oss: (out, router)
                here[1 + layer * (self.heads + 1) + self.heads] = out.clone()

            return hook

        def proj_hook(layer, channels, layout):
            def hook(module, args, output):
                output = output.clone()
                norm = self.sub(layer, spec["norm"])
                for c in channels:
                    for h in range(self.heads):
                        r = g.attention_rows(layer).start + "qkv".index(c) * self.heads + h
                        x = change(r, xs[layer])
                        if x is xs[layer]:
                            continue
                        cut = channel_slice(layout, c, h, self.heads, self.kv, self.d)
                        output[..., cut] = plain(module, plain(norm, x))[..., cut]
                return output

            return hook

        def mlp_in(layer):
            def hook(module, args):
                if spec["sequential"]:
                    attn = sum(here[1 + layer * (self.heads + 1) + h] for h in range(self.heads))
                    attn = attn + plain(
                        self.sub(layer, spec["out"]),
                        torch.zeros(*xs[layer].shape[:2], self.heads * self.d),
                    )
                    x_mid = xs[layer] + attn
                else:
                    x_mid = xs[layer]
                x = change(g.mlp_row(layer), x_mid)
                if x is x_mid:
                    return None
                return (plain(self.sub(layer, spec["mlp_norm"]), x),)

            return hook

        def final_hook(module, args):
            return (change(g.logits_row, args[0]),)

        for layer in range(g.layers):
            handles.append(
                self.sub(layer, spec["norm"]).register_forward_pre_hook(norm_hook(layer))
            )
            handles.append(self.sub(layer, spec["out"]).register_forward_pre_hook(out_hook(layer)))
            mlp = self.sub(layer, spec["mlp"])
            handles.append(mlp.register_forward_hook(mlp_out(layer)))
            handles.append(mlp.register_forward_pre_hook(mlp_in(layer)))
            by_module = {}
            for c, (path, layout) in spec["proj"].items():
                by_module.setdefault((path, layout), []).append(c)
            for (path, layout), channels in by_module.items():
                module = self.sub(layer, path)
                handles.append(module.register_forward_hook(proj_hook(layer, channels, layout)))
        final = self.model.get_submodule(spec["final"])
        handles.append(final.register_forward_pre_hook(final_hook))
        try:
            m = (
                full_metric(self.model, ids, pairs)
                if leaf is None
                else _metric_grad(self.model, ids, pairs)
            )
        finally:
            for h in handles:
                h.remove()
        self.here = here
        return m

    def writes(self, ids, pairs) -> dict:
        """sender index -> its write in the plain forward on `ids`."""
        self.run(ids, pairs)
        return {s: w.detach() for s, w in self.here.items()}


def _metric_grad(model, ids, pairs):
    logits = model(input_ids=ids).logits
    rows = torch.arange(ids.shape[0])
    picked = logits[rows, pairs.position]
    return picked[rows, pairs.targets[:, 0]] - picked[rows, pairs.targets[:, 1]]


def setup(name):
    built, model, causal = lm_of(name)
    pairs = pairs_for(built, causal, model.config.get_text_config().vocab_size)
    nodes = TaskNodes(model)
    return model, pairs, nodes


def key_or_value(graph: EdgeGraph, ref: Reference, receiver: int) -> bool:
    """A key or value receiver of a family whose heads share key/value groups."""
    if ref.kv == ref.heads or receiver == graph.logits_row:
        return False
    within = receiver % (3 * ref.heads + 1)
    return ref.heads <= within < 3 * ref.heads


def grouped_circuit(graph: EdgeGraph, heads: int, kv: int, seed: int, share: float = 0.5):
    """[receiver, sender] out-mask of a random circuit whose heads of a key/value group share
    their key and value edges."""
    g = torch.Generator().manual_seed(seed)
    reach = graph.reach()
    out = (torch.rand(reach.shape, generator=g) < share).float() * reach.float()
    size = heads // kv
    for layer in range(graph.layers):
        start = graph.attention_rows(layer).start
        for c in (1, 2):
            for h in range(heads):
                first = (h // size) * size
                out[start + c * heads + h] = out[start + c * heads + first]
    return out


def random_circuits_match(model, graph, ref, pairs, draws) -> list:
    """m(C) [row] of random circuits (`grouped_circuit`, one per (seed, share out) of `draws`),
    each asserted equal to the reference's hooked forward, to 1e-5."""
    corrupted, _ = es.recorded(model, graph, pairs, pairs.corrupted)
    ref_corrupted = ref.writes(pairs.corrupted, pairs)
    found = []
    for seed, share in draws:
        out = grouped_circuit(graph, ref.heads, ref.kv, seed, share)
        got = es.circuit_metric(model, graph, pairs, corrupted, out)
        with torch.no_grad():
            want = ref.run(pairs.clean, pairs, ref_corrupted, out)
        assert torch.allclose(got, want, atol=TOL), (seed, (got - want).abs().max())
        found.append(got)
    return found


@pytest.mark.parametrize("name", sorted(REFUSED - {"albert"}))
def test_refused_in_one_line(name):
    model, pairs, nodes = setup(name)
    with pytest.raises(UsageError) as err:
        EdgeGraph.of(nodes, pairs.clean)
    assert "\n" not in str(err.value) and str(err.value).startswith("circuit:")


@pytest.mark.parametrize("name", sorted(LAYOUT))
def test_circuits_equal_a_hooked_forward(name):
    """Empty and full circuits give m_corrupted and m_clean; random circuits and the exact path
    patching of single edges equal the reference's hooked forward, to 1e-5."""
    model, pairs, nodes = setup(name)
    graph = EdgeGraph.of(nodes, pairs.clean)
    ref = Reference(name, model, graph)
    reach = graph.reach()
    m_clean = full_metric(model, pairs.clean, pairs)
    m_corrupted = full_metric(model, pairs.corrupted, pairs)
    corrupted, _ = es.recorded(model, graph, pairs, pairs.corrupted)
    empty = es.circuit_metric(model, graph, pairs, corrupted, reach.float())
    full = es.circuit_metric(model, graph, pairs, corrupted, torch.zeros(reach.shape))
    assert torch.allclose(empty, m_corrupted, atol=TOL)
    assert torch.allclose(full, m_clean, atol=TOL)
    ref_corrupted = ref.writes(pairs.corrupted, pairs)
    assert m_clean.abs().max() > 1e-3 and (m_clean - m_corrupted).abs().max() > 1e-4
    got = random_circuits_match(model, graph, ref, pairs, ((0, 0.5), (1, 0.1), (2, 0.9)))
    moved = max(float((m - m_clean).abs().max()) for m in got)
    assert moved > 0.05 * float((m_clean - m_corrupted).abs().max())  # circuits changed m
    draw = torch.randperm(int(reach.sum()), generator=torch.Generator().manual_seed(3))
    edges = [tuple(e) for e in reach.nonzero()[draw].tolist() if not key_or_value(graph, ref, e[0])]
    edges = edges[:6]  # a key/value edge into one head of a group: the next test
    exact = es.edge_exact(model, graph, pairs, corrupted, m_clean, edges)
    for i, (r, s) in enumerate(edges):
        out = torch.zeros(reach.shape)
        out[r, s] = 1.0
        with torch.no_grad():
            want = m_clean - ref.run(pairs.clean, pairs, ref_corrupted, out)
        assert torch.allclose(exact[:, i], want, atol=TOL), (graph.receivers()[r], s)


@pytest.mark.parametrize("name", ["llama-gqa", "falcon-alibi"])
def test_a_key_edge_into_one_head_of_a_group_changes_that_head_alone(name):
    """Under grouped-query attention a key (value) edge into head h changes h's output only: the
    other heads of its group keep their clean outputs, in the layer it enters."""
    model, pairs, nodes = setup(name)
    graph = EdgeGraph.of(nodes, pairs.clean)
    ref = Reference(name, model, graph)
    assert ref.kv < ref.heads
    corrupted, _ = es.recorded(model, graph, pairs, pairs.corrupted)
    layer, head = graph.layers - 1, 1
    for c in (1, 2):
        out = torch.zeros(graph.reach().shape)
        r = graph.attention_rows(layer).start + c * ref.heads + head
        out[r, 0] = 1.0  # the embeddings' edge into head 1's key (value)
        seen = {}

        def keep(module, args, seen=seen):
            seen.setdefault("z", args[0][: pairs.clean.shape[0]].clone())

        hook = nodes.projections[layer].register_forward_pre_hook(keep)
        try:
            es.circuit_metric(model, graph, pairs, corrupted, out)
        finally:
            hook.remove()
        clean, _ = es.recorded(model, graph, pairs, pairs.clean)
        z = nodes._heads(layer, seen["z"])  # [batch, piece, head, d_head]
        same = [h for h in range(ref.heads) if h != head]
        assert torch.allclose(z[:, :, same], clean.slices[layer][:, :, same], atol=1e-6)
        assert (z[:, :, head] - clean.slices[layer][:, :, head]).abs().max() > 1e-5


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "gpt-neox", "qwen3"])
def test_edge_gradients_equal_autograd_on_the_hooked_forward(name):
    """EAP's gradient at a receiver's input (a head's query, key or value, an MLP, the logits)
    equals autograd's on the reference forward with a zero added to that receiver alone; EAP's
    score is that gradient dotted with the sender's write change, and EAP-IG with one step is EAP."""
    model, pairs, nodes = setup(name)
    graph = EdgeGraph.of(nodes, pairs.clean)
    ref = Reference(name, model, graph)
    got = es.edge_scores(model, graph, pairs, steps=1)
    assert torch.equal(got.eap, got.eap_ig)
    clean = ref.writes(pairs.clean, pairs)
    corrupted = ref.writes(pairs.corrupted, pairs)
    start = graph.attention_rows(graph.layers - 1).start
    receivers = [
        start + 1,
        start + ref.heads + 2,
        start + 2 * ref.heads,
        graph.mlp_row(0),
        graph.logits_row,
    ]
    for r in receivers:
        bound = graph.bound(r)
        x = torch.zeros(*pairs.clean.shape, clean[0].shape[-1], requires_grad=True)
        m = ref.run(pairs.clean, pairs, leaf=(r, x))
        (grad,) = torch.autograd.grad(m.sum(), x)  # [batch, piece, hidden]
        rows = [r]
        if key_or_value(graph, ref, r):  # the reference moves the group's key: its heads' sum
            size = ref.heads // ref.kv
            within = (r - start) % ref.heads
            first = r - within + (within // size) * size
            rows = list(range(first, first + size))
        for s in range(bound):
            want = (grad * (clean[s] - corrupted[s])).sum((1, 2))
            have = got.eap[:, rows, s].sum(1)
            assert torch.allclose(have, want, atol=1e-6, rtol=1e-4), (r, s, have, want)
        assert (got.eap[:, r, bound:] == 0).all()
        assert got.eap[:, r, :bound].abs().max() > 0


def test_the_shared_prefix_changes_nothing():
    """Running the pieces after the shared prefix gives the same scores and m(C) as the whole
    prompt (the prefix's writes are the same in every forward of a batch)."""
    model, pairs, nodes = setup("llama-gqa")
    graph = EdgeGraph.of(nodes, pairs.clean)
    prefix = es.Prefix(model, nodes, pairs)
    assert prefix.pieces == 3
    reach = graph.reach()
    out = grouped_circuit(graph, graph.heads, model.config.num_key_value_heads, 5, 0.5)
    corrupted, _ = es.recorded(model, graph, pairs, pairs.corrupted)
    whole = es.circuit_metric(model, graph, pairs, corrupted, out)
    short_corrupted, _ = es.recorded(model, graph, pairs, pairs.corrupted, prefix)
    short = es.circuit_metric(model, graph, pairs, short_corrupted, out, prefix)
    assert torch.allclose(whole, short, atol=TOL)
    index = torch.tensor([0, 2])
    sub = pairs.rows(index)
    sub_corrupted, _ = es.recorded(model, graph, sub, sub.corrupted, prefix.rows(index))
    part = es.circuit_metric(model, graph, sub, sub_corrupted, out, prefix.rows(index))
    assert torch.allclose(part, whole[index], atol=TOL)
    assert (
        whole - es.circuit_metric(model, graph, pairs, corrupted, 0 * reach.float())
    ).abs().max() > 1e-4


def test_the_graph_counts_its_edges():
    """Senders reach the receivers of later layers; an MLP reads its own layer's heads where the
    layer runs its MLP after its attention (GPT-2), not where they run side by side (GPT-NeoX)."""
    for name, sequential in (("gpt2", True), ("gpt-neox", False)):
        model, pairs, nodes = setup(name)
        graph = EdgeGraph.of(nodes, pairs.clean)
        L, H = graph.layers, graph.heads
        assert graph.sequential == [sequential] * L
        attention = sum(3 * H * (1 + layer * (H + 1)) for layer in range(L))
        mlp = sum(1 + layer * (H + 1) + (H if sequential else 0) for layer in range(L))
        logits = 1 + L * (H + 1)
        assert int(graph.reach().sum()) == attention + mlp + logits


@pytest.mark.parametrize("gather", [0, 10**9])
@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_circuits_are_exact_whether_senders_are_gathered_or_not(name, gather, monkeypatch):
    """A receiver's sum over out-of-circuit senders is taken over only the senders some row
    needs (gathered first, or not) and, where fewer are in the circuit, as the sum of all less
    the in-circuit ones: every way gives the hooked forward's m(C)."""
    from headprobe.model import circuit_forward

    monkeypatch.setattr(circuit_forward, "GATHER", gather)
    model, pairs, nodes = setup(name)
    graph = EdgeGraph.of(nodes, pairs.clean)
    ref = Reference(name, model, graph)
    random_circuits_match(model, graph, ref, pairs, ((4, 0.05), (5, 0.5), (6, 0.95)))


def test_edge_scores_compute_no_parameter_gradient():
    """The gradient passes are taken with respect to the receivers' inputs alone: no parameter's
    gradient is computed (a hook on every parameter stays silent), and every parameter needs a
    gradient afterwards as it did before."""
    model, pairs, nodes = setup("llama-gqa")
    graph = EdgeGraph.of(nodes, pairs.clean)
    calls = []
    handles = [p.register_hook(lambda g: calls.append(1)) for p in model.parameters()]
    before = [p.requires_grad for p in model.parameters()]
    try:
        got = es.edge_scores(model, graph, pairs, steps=2)
    finally:
        for h in handles:
            h.remove()
    assert got.eap.abs().max() > 0 and got.eap_ig.abs().max() > 0
    assert calls == []
    assert [p.requires_grad for p in model.parameters()] == before and any(before)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_eap_ig_equals_gradients_averaged_on_the_hooked_forward(name):
    """EAP-IG with 3 steps: the reference's gradient at each receiver's input, averaged over the
    forwards whose token embeddings are corrupted + a (clean - corrupted) for a = 1/3, 2/3, 1,
    dotted with each sender's write change (clean - corrupted)."""
    model, pairs, nodes = setup(name)
    graph = EdgeGraph.of(nodes, pairs.clean)
    ref = Reference(name, model, graph)
    got = es.edge_scores(model, graph, pairs, steps=3)
    clean = ref.writes(pairs.clean, pairs)
    corrupted = ref.writes(pairs.corrupted, pairs)
    embedding = model.get_input_embeddings()
    with torch.no_grad():
        start, end = embedding(pairs.corrupted), embedding(pairs.clean)
    receivers = [graph.attention_rows(graph.layers - 1).start, graph.mlp_row(0), graph.logits_row]
    for r in receivers:
        grad = 0.0
        for a in (1 / 3, 2 / 3, 1.0):
            point = start + a * (end - start)
            handle = embedding.register_forward_hook(lambda m, args, out, p=point: p)
            try:
                x = torch.zeros(*pairs.clean.shape, clean[0].shape[-1], requires_grad=True)
                m = ref.run(pairs.clean, pairs, leaf=(r, x))
                grad = grad + torch.autograd.grad(m.sum(), x)[0] / 3
            finally:
                handle.remove()
        for s in range(graph.bound(r)):
            want = (grad * (clean[s] - corrupted[s])).sum((1, 2))
            assert torch.allclose(got.eap_ig[:, r, s], want, atol=1e-6, rtol=1e-4), (r, s)
        assert not torch.allclose(got.eap_ig[:, r], got.eap[:, r])  # the path moved the scores
