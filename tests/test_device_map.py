"""Models spread over devices (issue 12): accelerate's big-model dispatch.

On a CPU-only machine the layers are placed per layer through accelerate's
`dispatch_model` (every module behind accelerate's hooks: "cpu", and "disk" for
offloaded layers whose weights sit on the meta device until their forward), and
`models.load(..., device_map=...)` goes through `from_pretrained(device_map=...)`.
Counts must equal the plain model's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import get_family
from test_query_block import corpus, score

from headprobe.model import loading as models
from headprobe.model.sites import model_device

accelerate = pytest.importorskip("accelerate")


def dispatched(model, device_map, offload_dir=None):
    return accelerate.dispatch_model(
        copy.deepcopy(model), device_map=device_map, offload_dir=offload_dir, force_hooks=True
    )


def bert_map(layer_1="cpu"):
    return {
        "embeddings": "cpu",
        "encoder.layer.0": "cpu",
        "encoder.layer.1": layer_1,
        "encoder.layer.2": "cpu",
        "pooler": "cpu",
    }


@pytest.mark.parametrize("offload", [False, True])
def test_per_layer_dispatch_gives_the_plain_counts(bert_family, tmp_path, offload):
    model = dispatched(
        bert_family.sdpa, bert_map("disk" if offload else "cpu"), tmp_path if offload else None
    )
    layers = model.encoder.layer
    assert all(hasattr(layer, "_hf_hook") for layer in layers)  # behind accelerate's hooks
    if offload:
        assert next(layers[1].parameters()).device.type == "meta"  # loaded from disk per forward
    assert model_device(model) == torch.device("cpu")
    examples = corpus(seed=4)[:16]
    plain_engine, plain = score(bert_family, examples)
    family = copy.copy(bert_family)
    family.sdpa = model
    split_engine, split = score(family, examples)
    assert (plain.n.values == split.n.values).all()
    assert (plain.hits.fillna(-1).values == split.hits.fillna(-1).values).all()
    assert (plain.mass.fillna(-1).values == split.mass.fillna(-1).values).all()


def test_dispatched_causal_gqa_with_query_blocks():
    llama = get_family("llama")
    device_map = {
        "embed_tokens": "cpu",
        "layers.0": "cpu",
        "layers.1": "cpu",
        "norm": "cpu",
        "rotary_emb": "cpu",
    }
    family = copy.copy(llama)
    family.sdpa = dispatched(llama.sdpa, device_map)
    examples = corpus(seed=5)[:12]
    _, plain = score(llama, examples)
    _, split = score(family, examples, query_block=8)
    assert (plain.hits.fillna(-1).values == split.hits.fillna(-1).values).all()


def test_models_load_with_a_device_map(tmp_path):
    """`models.load(path, device_map=..., max_memory=...)`: accelerate's dispatch in from_pretrained
    (a layer offloaded to disk, so that transformers puts the model behind hooks on one CPU)."""
    llama = get_family("llama")
    llama.sdpa.save_pretrained(tmp_path / "model")
    llama.tokenizer.save_pretrained(tmp_path / "model")
    model, _, _ = models.load(str(tmp_path / "model"), device_map="auto", max_memory="cpu=2GiB")
    assert next(model.parameters()).device.type == "cpu"
    device_map = {
        "embed_tokens": "cpu",
        "layers.0": "cpu",
        "layers.1": "disk",
        "norm": "cpu",
        "rotary_emb": "cpu",
    }
    model, _, _ = models.load(
        str(tmp_path / "model"), device_map=device_map, offload_folder=tmp_path / "offload"
    )
    assert model.hf_device_map["layers.1"] == "disk" and hasattr(model.layers[1], "_hf_hook")
    assert model_device(model) == torch.device("cpu")
    family = copy.copy(llama)
    family.sdpa = model
    examples = corpus(seed=6)[:8]
    _, plain = score(llama, examples)
    _, loaded = score(family, examples)
    assert (plain.hits.fillna(-1).values == loaded.hits.fillna(-1).values).all()


def test_parse_max_memory():
    assert models.parse_max_memory("0=10GiB, cpu=30GiB") == {0: "10GiB", "cpu": "30GiB"}
    assert models.parse_max_memory(None) is None
    assert models.parse_max_memory({"cpu": "1GiB"}) == {"cpu": "1GiB"}
    with pytest.raises(ValueError, match="DEVICE=SIZE"):
        models.parse_max_memory("10GiB")
