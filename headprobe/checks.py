"""Checks of every option and path of a run, done before any model is loaded.

Each check raises `UsageError` with one line naming the option, the value and what
is wrong; the CLI prints it and exits with status 2.

Which option gets which check is declared with the option (`headprobe.config.RunConfig`).
Order in `headprobe.run` (`RunConfig.checked`): options and ranges, input files, model
name/path, device, `--out` (`store.check_out`, beside the layout it checks for); then the
lock on `--out`; then the model's config (AutoConfig: layers asked for must exist); only
then the weights.
"""

from __future__ import annotations

import numbers
import os
import re
from pathlib import Path

from headprobe.core.errors import UsageError

MIN_WINDOW = 8
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def _first_line(text) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


# ----------------------------------------------------------------------------------------
# numbers and layer lists
# ----------------------------------------------------------------------------------------
def check_int(option: str, value, low: int, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UsageError(f"{option} must be a whole number, not {value!r}")
    if value < low:
        raise UsageError(f"{option} must be at least {low}{what}, not {value}")
    return int(value)


def check_choice(option: str, value, choices) -> str:
    if value not in choices:
        raise UsageError(f"{option} {value!r}: must be one of {', '.join(map(str, choices))}")
    return value


def parse_layers(text) -> list[int] | None:
    """'0,2,5' or '0-3' or '0-3,8' -> sorted list of 0-based layers; None or '' -> all layers.
    A list or tuple of whole numbers is checked and sorted."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        layers = list(text)
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                raise UsageError(
                    f"--layers: {layer!r} is not a layer (layers are 0-based whole numbers)"
                )
        if not layers:
            raise UsageError("--layers: the list of layers is empty")
        return sorted(set(layers))
    layers: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            if dash:
                start, end = int(low), int(high)
            else:
                start = end = int(part)
        except ValueError:
            raise UsageError(
                f"--layers {text!r}: {part!r} is not a layer or a range like 0-3 "
                "(layers are 0-based whole numbers)"
            ) from None
        if start < 0 or end < 0:
            raise UsageError(f"--layers {text!r}: layers are 0-based, {part!r} is negative")
        if end < start:
            raise UsageError(
                f"--layers {text!r}: the range {part} runs backwards (did you mean {end}-{start}?)"
            )
        layers.update(range(start, end + 1))
    return sorted(layers)


def check_layers_exist(layers, n_layers: int, model: str) -> None:
    """Layers asked for must exist in the model (read from its config)."""
    if layers is None:
        return
    beyond = [layer for layer in layers if layer >= n_layers]
    if beyond:
        raise UsageError(
            f"--layers: {model} has {n_layers} layers (0-{n_layers - 1}); "
            f"layer {beyond[0]} does not exist"
        )


# ----------------------------------------------------------------------------------------
# device
# ----------------------------------------------------------------------------------------
def check_device(device):
    """None/'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N' when a GPU
    is there, 'mps' when available; anything else is refused."""
    if device is None:
        return None
    import torch

    text = str(device).strip().lower()
    if text == "auto":
        return "auto"
    kind, colon, index = text.partition(":")
    if kind == "cpu" and not colon:
        return "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"--device {device}: no CUDA GPU is available here "
                "(torch.cuda.is_available() is False); use --device cpu"
            )
        if colon:
            count = torch.cuda.device_count()
            if not index.isdigit() or int(index) >= count:
                raise UsageError(
                    f"--device {device}: there {'is' if count == 1 else 'are'} {count} CUDA "
                    f"device{'s' if count != 1 else ''} (cuda:0-cuda:{count - 1})"
                )
        return text
    if kind == "mps" and not colon:
        backend = getattr(torch.backends, "mps", None)
        if backend is None or not backend.is_available():
            raise UsageError(
                f"--device {device}: the Apple MPS backend is not available here; use --device cpu"
            )
        return "mps"
    raise UsageError(
        f"--device {device!r}: not a device headprobe can use (cpu, cuda, cuda:N, mps)"
    )


# ----------------------------------------------------------------------------------------
# input paths
# ----------------------------------------------------------------------------------------
def check_input_file(option: str, path) -> None:
    if path is None:
        return
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"{option} {path}: no such file")
    if not p.is_file():
        raise UsageError(f"{option} {path}: not a file")
    if not os.access(p, os.R_OK):
        raise UsageError(f"{option} {path}: not readable")


def looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or name.endswith("/")
        or os.path.exists(os.path.expanduser(name))
    )


def check_hf_dataset(spec) -> None:
    if spec is None:
        return
    head = str(spec).split("::", 1)[0] if "::" in str(spec) else str(spec)
    if looks_like_path(head) and not Path(head).expanduser().exists():
        raise UsageError(f"--hf-dataset {spec}: no such directory")


# ----------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------
def check_model(name):
    """(path or hub name, extra from_pretrained kwargs, display name), checked: a bundled
    alias must be installed; a local path must be a directory with a config.json; a hub
    name is accepted as is (its config is read next)."""
    from transformers.utils import CONFIG_NAME

    from headprobe.model import loading as models

    if name is None or str(name).lower() in models_aliases():
        try:
            return models.resolve(name)
        except ImportError as err:
            raise UsageError(
                f"--model {name or 'minilm'}: the bundled model is not installed ({err})"
            ) from None
    name = str(name)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UsageError(
                f"--model {name}: a file, not a model directory (one with {CONFIG_NAME})"
            )
        if not (path / CONFIG_NAME).is_file():
            raise UsageError(
                f"--model {name}: no {CONFIG_NAME} in this directory, so it is not a "
                "Hugging Face model directory"
            )
        return str(path), {}, name
    if looks_like_path(name):
        raise UsageError(f"--model {name}: no such model directory")
    hub, revision = models.split_revision(name)  # NAME@REVISION: a hub name at a revision
    if revision is not None and HUB_NAME.match(hub) and "--" not in hub and ".." not in hub:
        return hub, {"revision": revision}, name
    if not HUB_NAME.match(name) or "--" in name or ".." in name:
        raise UsageError(
            f"--model {name!r}: neither a local model directory nor a Hugging Face hub name "
            "(owner/name)"
        )
    return name, {}, name


def models_aliases() -> set[str]:
    return {
        "minilm",
        "all-minilm-l6-v2",
        "bundled",
        "smollm2",
        "smollm2-135m",
        "smollm2-135m-instruct",
    }


def read_config(path: str, extra: dict, display: str):
    """The model's config (no weights); a model whose config cannot be read is refused."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, **extra)
    except Exception as err:  # OSError, ValueError, EnvironmentError, HTTP errors...
        raise UsageError(
            f"--model {display}: cannot read its config ({type(err).__name__}: {_first_line(err)})"
        ) from None


def config_layers_heads(config, stack: str | None = None) -> tuple[int, int]:
    """(layers, heads) the config declares; an encoder-decoder's decoder layers for the
    decoder and cross stacks (0: not declared)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    decoder = (
        getattr(text, "num_decoder_layers", None) or getattr(text, "decoder_layers", None)
        if stack in ("decoder", "cross") and getattr(text, "is_encoder_decoder", False)
        else None
    )
    n_layers = decoder or getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    n_heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None)
    return int(n_layers or 0), int(n_heads or 0)


def check_stack_in_config(stack: str | None, config, model: str) -> None:
    """--stack cross needs an encoder-decoder (its config says so)."""
    if stack == "cross" and not getattr(config, "is_encoder_decoder", False):
        raise UsageError(f"--stack cross: {model} is not an encoder-decoder (no cross-attention)")


# names transformers' configs give the most positions a model reads
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx")


def max_positions(config) -> tuple[int, str] | None:
    """(the most positions the model reads, the config field that says so), or None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in POSITION_LIMITS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, name
    return None
