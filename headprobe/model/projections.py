"""The projections of a model, read as linear maps: which modules are projections and norms,
what a projection reads and writes, and its weight as stored.

Projections (`is_projection`): nn.Linear, GPT-2's Conv1D ([in, out]) and a pointwise
nn.Conv1d (kernel size 1: a linear map over channels, read channels-first, [batch, channel,
piece]; a grouped one is block-diagonal, `projection_weight` gives it whole). `features_last`
gives any projection's input or output as [batch, piece, feature].
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from headprobe.core.errors import CaptureError

# the base model's final norm, by family (Llama/Mistral/Qwen/Gemma/SmolLM2, GPT-2/GPT-J,
# OPT/T5/BART decoders, GPT-NeoX, Falcon, Mamba-style): `final_norm`
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "final_norm")


def is_projection(module: nn.Module) -> bool:
    """A linear map headprobe reads weights from: nn.Linear, transformers' Conv1D (GPT-2), or a
    pointwise nn.Conv1d (`is_pointwise_conv`: SqueezeBERT's)."""
    return isinstance(module, (nn.Linear, Conv1D)) or is_pointwise_conv(module)


def is_pointwise_conv(module: nn.Module) -> bool:
    """An nn.Conv1d that is a linear map over channels at each position: kernel size 1, stride 1,
    no padding (any groups: a grouped one is block-diagonal)."""
    return (
        isinstance(module, nn.Conv1d)
        and module.kernel_size == (1,)
        and module.stride == (1,)
        and module.padding in ((0,), "valid", "same")
    )


def features_last(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A projection's input or output `x` as [batch, piece, feature]: a pointwise nn.Conv1d's
    channels-first [batch, channel, piece] transposed (a view), any other unchanged. Its own
    inverse: `features_last(module, features_last(module, x))` is x."""
    return x.transpose(-1, -2) if isinstance(module, nn.Conv1d) else x


def is_norm(module: nn.Module) -> bool:
    """A normalisation layer (LayerNorm, RMSNorm, T5LayerNorm, ...), by its class name."""
    return "norm" in type(module).__name__.lower()


def tensors_of(output) -> list[torch.Tensor]:
    """The tensors a module returned: itself, or those of a tuple, list or dict (ModelOutput)."""
    values = list(output.values()) if isinstance(output, dict) else output
    values = values if isinstance(values, (tuple, list)) else [values]
    return [t for t in values if torch.is_tensor(t)]


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a` is `b` or a view of the same storage and size (a reshape that copied nothing)."""
    return a is b or (a.data_ptr() == b.data_ptr() and a.numel() == b.numel())


# ---------------------------------------------------------------------- weights of a site
def projection_in_features(module: nn.Module) -> int | None:
    """Input features of a linear map (nn.Linear, GPT-2's Conv1D, a pointwise nn.Conv1d's input
    channels), else None."""
    if isinstance(module, nn.Linear):
        return module.in_features
    if isinstance(module, Conv1D):
        return module.nx
    if is_pointwise_conv(module):
        return module.in_channels
    return None


def stored_weight(module: nn.Module) -> torch.Tensor:
    """The weight tensor as the module keeps it; one offloaded by accelerate (on the meta device
    between forwards) is read from the offload map of the module's hook."""
    weight = module.weight
    if weight.device.type == "meta":
        hook = getattr(module, "_hf_hook", None)
        weights_map = getattr(hook, "weights_map", None)
        if weights_map is None or "weight" not in weights_map:
            raise CaptureError(
                f"the weight of {type(module).__name__} is offloaded (meta device) and "
                "cannot be read; place that layer on a device"
            )
        weight = weights_map["weight"]
    return weight


def projection_weight(module: nn.Module) -> torch.Tensor:
    """[out, in]: the weight of nn.Linear; of GPT-2's Conv1D (stored [in, out]) transposed; of a
    pointwise nn.Conv1d (stored [out, in / groups, 1]) whole: with `groups` g, output channel
    block k reads input channel block k only, so the map is block-diagonal (zeros elsewhere)."""
    weight = stored_weight(module)
    if isinstance(module, Conv1D):
        return weight.T
    if is_pointwise_conv(module):
        return torch.block_diag(*weight[..., 0].chunk(module.groups, dim=0))  # [out, in]
    return weight


def final_norm(base: nn.Module) -> nn.Module | None:
    """The base model's final norm (a child named in `FINAL_NORMS` with a weight), or None."""
    for name in FINAL_NORMS:
        found = getattr(base, name, None)
        if isinstance(found, nn.Module) and getattr(found, "weight", None) is not None:
            return found
    return None
