"""How many examples a batch holds when the run is not told (`--batch-size` left out).

On the CPU: `CPU_BATCH` (64). On a GPU: as many typical examples as half of the device's free
memory holds, as a power of two from `CPU_BATCH` to `MOST`. The size a run used is recorded in its
checkpoint, and `--resume` uses it again (a resumed run must make the batches the interrupted one
made; the free memory at resume time does not decide).
"""

from __future__ import annotations

import torch

CPU_BATCH = 64
MOST = 1024
TYPICAL_PIECES = 64  # pieces of the example the GPU size is reckoned for
SHARE = 0.5  # of the free device memory


def example_bytes(n_layers: int, n_heads: int, hidden: int, intermediate: int) -> int:
    """Device bytes one example of `TYPICAL_PIECES` pieces needs at the peak of a scored forward
    pass (float32): the residual stream and its working copies (about 12 per layer, all layers
    held by the capture's stack in the worst case), the feed-forward's intermediate, and per layer
    the attention's scores, probabilities and their scored copies (4 matrices)."""
    t = TYPICAL_PIECES
    per_layer = 4 * t * (12 * hidden + 2 * intermediate) + 4 * 4 * n_heads * t * t
    return n_layers * per_layer


def batch_size_for(free_bytes: int, n_layers: int, n_heads: int, hidden: int, intermediate: int):
    """The batch size for a GPU with `free_bytes` free: a power of two in [CPU_BATCH, MOST]."""
    fits = int(SHARE * free_bytes) // max(1, example_bytes(n_layers, n_heads, hidden, intermediate))
    size = CPU_BATCH
    while size * 2 <= min(fits, MOST):
        size *= 2
    return size


def auto_batch_size(model, device) -> int:
    """The batch size for `model` on `device` (`CPU_BATCH` on anything but a CUDA device)."""
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_BATCH
    from headprobe.model.sites import text_config

    config = text_config(model)
    hidden = int(getattr(config, "hidden_size", None) or getattr(config, "d_model", 768))
    layers = int(getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", 12))
    heads = int(
        getattr(config, "num_attention_heads", None) or getattr(config, "num_heads", None) or 12
    )
    intermediate = int(
        getattr(config, "intermediate_size", None) or getattr(config, "d_ff", None) or 4 * hidden
    )
    free, _ = torch.cuda.mem_get_info(device)
    return batch_size_for(free, layers, heads, hidden, intermediate)
