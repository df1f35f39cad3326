"""Where each layer's MLP writes to the residual stream (METHODS §18, MLP senders).

    modules = mlp_modules(model, "decoder")   # [layer] -> the module whose output is the write

The write of layer l's MLP is the output of one module of the layer's block, found by name:
the first of `MLP_NAMES` that names exactly one module of the block (the innermost ancestor
of the layer's attention module that holds one), outside every attention module and output
projection. "mlp" (GPT-2, GPT-NeoX, Llama, Mistral, Qwen, Phi-3, Gemma, ModernBERT, gpt-oss),
"ffn_output" (ALBERT), "ffn" (DistilBERT), "DenseReluDense" (T5), "fc2" (OPT, BART),
"output.dense" (BERT, RoBERTa, ELECTRA, XLM-R: the block's own `output.dense`). A norm the
family applies to that output before the residual add (Gemma-2/3's
`post_feedforward_layernorm`) is found in the clean pass (`layer_cache`), and the pass checks
that the write found is what the residual stream receives; a family where no module is found,
or where the check fails, is refused with one line naming it (never scored wrong).
"""

from __future__ import annotations

from torch import nn

from headprobe.core.errors import UsageError
from headprobe.model.discovery import attention_sites

# module names of an MLP's write, in order of preference (a dotted one: the path in the block)
MLP_NAMES = ("mlp", "feed_forward", "ffn_output", "ffn", "DenseReluDense", "fc2", "output.dense")


def mlp_modules(model, stack: str) -> list[nn.Module]:
    """Per layer of `stack`, the module whose output is its MLP's write (module docstring);
    UsageError (one line, naming the family) where a layer has none."""
    sites = attention_sites(model)
    excluded = {id(s.module) for s in sites.sites} | {id(s.output) for s in sites.sites}
    names = {id(m): n for n, m in model.named_modules()}
    found = []
    for site in sites.of(stack):
        module = _in_block(model, names[id(site.module)], excluded)
        if module is None:
            raise UsageError(
                f"composition: no MLP found in layer {site.layer} of {sites.model_class}'s "
                f"{stack} stack (looked for {', '.join(MLP_NAMES)}), so its MLP writes cannot be "
                "reached; leave mlp out of the senders"
            )
        found.append(module)
    return found


def _in_block(model, attention: str, excluded: set) -> nn.Module | None:
    """The MLP write module of the innermost ancestor of `attention` (a module name) that holds
    exactly one module of the first name of `MLP_NAMES` found there."""
    parts = attention.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        block = model.get_submodule(".".join(parts[:depth])) if depth else model
        inside = _outside(block, excluded)
        for pattern in MLP_NAMES:
            hits = [(n, m) for n, m in inside if _named(n, pattern)]
            hits = [(n, m) for n, m in hits if not any(n.startswith(o + ".") for o, _ in hits)]
            if len(hits) == 1:
                return hits[0][1]
            if hits:  # more than one: not this layer's alone
                return None
    return None


def _outside(block: nn.Module, excluded: set) -> list[tuple[str, nn.Module]]:
    """(name, module) of `block`'s submodules that are not inside an excluded module."""
    out, skip = [], []
    for name, module in block.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        if id(module) in excluded:
            skip.append(name)
            continue
        out.append((name, module))
    return out


def _named(name: str, pattern: str) -> bool:
    if "." in pattern:
        return name == pattern
    return name.rsplit(".", 1)[-1] == pattern
