"""Greedy decoding with the KV cache, handing on each step's attention row (METHODS §16).

    from headprobe.model.decoding import decode, stop_tokens

    def on_step(step):                       # once per decoding step, then dropped
        step.index                           # 0, 1, ...
        step.token                           # [batch] long: the token this step chose
        step.active                          # [batch] bool: rows still generating at this step
        step.rows[layer]                     # [batch, head, key] float32: the step's query row
    model, tokenizer, name, kind = headprobe.model.loading.load_lm("smollm2")
    out = decode(model, input_ids, on_step, stop=stop_tokens(tokenizer, model))
    out.ids, out.lengths, out.stopped        # [batch, steps], [batch], [batch]
    out.texts(tokenizer)                     # each row's response
    out = decode(model, input_ids, forced=answer_ids, forced_mask=answer_mask)
    out.forced                               # [batch, answer] log p of each forced token

`model` has a language-model head (`load_lm`); `input_ids` `[batch, piece]` is the prompt
(several prompts: left-padded, with `attention_mask`; positions count the real tokens only).

The prompt but its last token is run first, in chunks of `prefill_chunk` tokens, with the model's
own attention and nothing captured (no attention of the prompt is kept). Step t then feeds one
token (step 0 the prompt's last, step t its predecessor's choice) over the cache: its query row
over every cached key, the step's own included, is captured in every asked-for layer, and its
logits choose the token greedily (argmax). So `step.rows` is the attention of the query that chose
`step.token`, as in Wu et al.'s (2024) released code. A row stops after it chose a token of
`stop` (kept in its ids) or after `max_new_tokens`; decoding ends when every row has stopped.

With `forced` ([batch, k] tokens, right-padded, `forced_mask` 1 on the real ones), the same
prefill also gives those tokens' teacher-forced log-probabilities after the prompt (`out.forced`,
0 where masked): the prompt's last token and the forced ones but the last are run over a copy
of the prompt's cache, nothing captured, and the copy is dropped; decoding then goes on from the
prompt as without them (the answer given the right prefix, at the cost of k tokens, not of a
second pass over the prompt).

The rows are the capture's `last_row` quantity (`headprobe.model.capture`): recomputed from the
step's query and the cached keys as eager attention would (each query head its own row; grouped
query heads read their KV group's keys), in float32, while the model's own attention (SDPA by
default) computes the output, so the tokens are those `model.generate(do_sample=False)` chooses.
Key j of a row is position j of the (left-padded) sequence: `step.rows[l][b, h, pad_b + i]` is
prompt token i of row b, where `pad_b` is the row's padding. Memory: the cache and one step's
rows, O(layers x heads x keys) per row; the prefill holds O(prefill_chunk x keys) per head at most.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from headprobe.model.capture import AttentionCapture
from headprobe.model.sites import model_device

MAX_NEW_TOKENS = 32  # the answer's budget (METHODS §16)
PREFILL_CHUNK = 1024  # prompt tokens per prefill call


@dataclass
class Step:
    """One decoding step: the token it chose and its query row in every asked-for layer."""

    index: int  # 0-based step
    token: torch.Tensor  # [batch] long: the token chosen (pad where the row had stopped)
    active: torch.Tensor  # [batch] bool: rows still generating at this step
    rows: dict[int, torch.Tensor]  # layer -> [batch, head, key] float32


@dataclass
class Decoded:
    """What `decode` generated: per row the tokens up to and with its stop token."""

    ids: torch.Tensor  # [batch, steps] long, pad after a row's last token
    lengths: torch.Tensor  # [batch] long: tokens each row generated
    stopped: torch.Tensor  # [batch] bool: the row ended on a stop token
    forced: torch.Tensor | None = None  # [batch, k] float32: log p of each forced token, 0 masked

    def row(self, b: int) -> list[int]:
        """The tokens row `b` generated, its stop token included."""
        return self.ids[b, : int(self.lengths[b])].tolist()

    def texts(self, tokenizer) -> list[str]:
        """Each row's response: its tokens decoded, special tokens left out."""
        return [
            tokenizer.decode(self.row(b), skip_special_tokens=True) for b in range(len(self.ids))
        ]


def stop_tokens(tokenizer, model=None) -> frozenset[int]:
    """The ids that end an answer: end-of-turn (the tokenizer's EOS, the model's generation
    config's `eos_token_id`, one or several) and every token whose text holds a newline."""
    ids = {tokenizer.eos_token_id}
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    ids.update(i for i, text in enumerate(texts) if "\n" in text)
    return frozenset(int(i) for i in ids if i is not None)


def _cache_name(module) -> str:
    """The keyword a model's forward takes its KV cache under (`cache` since transformers 5.x,
    before it `past_key_values`)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def _cache_of(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def _prefill(model, ids, mask, positions, chunk: int):
    """The cache after the prompt's first tokens, `chunk` at a time, through the model without its
    head (no logits) and without capture; None for an empty prompt."""
    body = getattr(model, "base_model", model)
    name, cache = _cache_name(body), None
    for start in range(0, ids.shape[1], chunk):
        stop = min(start + chunk, ids.shape[1])
        out = body(
            input_ids=ids[:, start:stop],
            attention_mask=mask[:, :stop],
            position_ids=positions[:, start:stop],
            use_cache=True,
            **{name: cache},
        )
        cache = _cache_of(out)
    return cache


def _forced(model, cache, last, mask, position, forced, forced_mask) -> torch.Tensor:
    """[batch, k] float32 log p of `forced` [batch, k] after the prompt whose cache is `cache` (all
    but its last token `last` [batch, 1], at `position` [batch, 1]; `mask` its attention mask),
    over a copy of the cache; 0 where `forced_mask` is 0."""
    fed = torch.cat([last, forced[:, :-1]], dim=1)  # [batch, k]
    fed_mask = torch.cat([mask, forced_mask[:, :-1]], dim=1)  # [batch, piece + k - 1]
    steps = torch.arange(fed.shape[1], device=fed.device)[None, :]
    out = model(
        input_ids=fed,
        attention_mask=fed_mask,
        position_ids=position + steps,
        use_cache=True,
        **{_cache_name(model): copy.deepcopy(cache)},
    )
    logp = out.logits.float().log_softmax(-1).gather(-1, forced[..., None])[..., 0]  # [batch, k]
    return logp.masked_fill(forced_mask == 0, 0.0)


def decode(
    model,
    input_ids: torch.Tensor,
    callback: Callable[[Step], None] | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
    stop: Iterable[int] = (),
    layers: Iterable[int] | None = None,
    prefill_chunk: int = PREFILL_CHUNK,
    pad_id: int = 0,
    forced: torch.Tensor | None = None,
    forced_mask: torch.Tensor | None = None,
) -> Decoded:
    """Greedy decoding of `input_ids` ([batch, piece], left-padded) with the KV cache; each step's
    query row in `layers` (default all) goes to `callback(step)` (a `Step`) and is then dropped.
    `forced` ([batch, k], `forced_mask` 1 on its real tokens): read those tokens' log p after the
    prompt first, teacher-forced (`Decoded.forced`)."""
    if max_new_tokens < 1 or prefill_chunk < 1:
        raise ValueError("decode needs max_new_tokens >= 1 and prefill_chunk >= 1")
    device = model_device(model)
    ids = input_ids.to(device)
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [batch, piece]: real tokens counted
    stops = torch.tensor(sorted(set(stop)), dtype=torch.long, device=device)
    with torch.inference_mode():
        cache = _prefill(model, ids[:, :-1], mask, positions[:, :-1], prefill_chunk)
        token, position = ids[:, -1:], positions[:, -1:]  # [batch, 1]
        forced_logp = None
        if forced is not None:
            forced = forced.to(device)
            given = torch.ones_like(forced) if forced_mask is None else forced_mask.to(device)
            forced_logp = _forced(model, cache, token, mask, position, forced, given)
        start = (cache, token, mask, position)
        chosen, lengths, stopped = _steps(
            model, start, callback, layers, max_new_tokens, stops, pad_id
        )
    return Decoded(chosen, lengths, stopped, forced_logp)


def _steps(model, start, callback, layers, max_new_tokens: int, stops, pad_id: int):
    """(ids [batch, steps], lengths [batch], stopped [batch]) of greedy steps from `start` =
    (cache, token [batch, 1], mask, position [batch, 1]): each step's query rows in `layers` go to
    `callback` and are dropped; a row ends at a token in `stops` ([stop] long)."""
    cache, token, mask, position = start
    rows: dict[int, torch.Tensor] = {}
    chosen: list[torch.Tensor] = []
    active = torch.ones(token.shape[0], dtype=torch.bool, device=token.device)  # [batch]
    stopped = torch.zeros_like(active)
    lengths = torch.zeros(token.shape[0], dtype=torch.long, device=token.device)
    name = _cache_name(model)
    keep = lambda layer, heads: rows.__setitem__(layer, heads["last_row"])  # noqa: E731
    with AttentionCapture(model, layers, keep, needs={"last_row"}):
        for index in range(max_new_tokens):
            out = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=position,
                use_cache=True,
                **{name: cache},
            )
            cache = _cache_of(out)
            pick = out.logits[:, -1].argmax(-1).masked_fill(~active, pad_id)  # [batch]
            chosen.append(pick)
            if callback is not None:
                callback(Step(index, pick, active.clone(), dict(rows)))
            rows.clear()
            lengths += active
            ends = active & torch.isin(pick, stops)
            stopped |= ends
            active &= ~ends
            if not active.any():
                break
            token, position = pick[:, None], position + 1
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
    return torch.stack(chosen, dim=1), lengths, stopped  # ids: [batch, steps]
