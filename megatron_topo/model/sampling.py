"""Choosing next tokens from a causal LM's logits (tools/generate.py): greedy decoding, temperature,
top-k and top-p (nucleus) filtering, sampled with a caller-owned ``torch.Generator`` so a seed
gives the same tokens on every run. No KV cache: every new token recomputes the whole context
(GPT-NeoX's ``recompute: true``)."""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """1-D ``logits`` with -inf for every token outside the ``top_k`` most likely (0: none left
    out) and outside the nucleus: the smallest set of most likely tokens whose probabilities sum
    to >= ``top_p`` (0 or 1: none left out). The most likely token is always kept, whatever
    ``top_p`` (a subnormal 1e-310 is 0 in float32: compared in float64, and the first token is kept
    by its rank, not by a comparison)."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        probs = torch.softmax(logits, -1)
        sorted_p, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(sorted_p, 0) - sorted_p  # the mass of the tokens more likely than each
        drop_sorted = before.double() >= top_p
        drop_sorted[0] = False  # the nucleus holds at least the most likely token
        drop = torch.zeros_like(order, dtype=torch.bool).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits`` divided by ``temperature`` (below 1e-6 counts as 1e-6) after shifting them so the
    largest is 0 (the softmax is unchanged), in float64: with finite logits the result is never NaN,
    whatever the temperature (float32 would turn a temperature past 3.4e38 or a shift across its
    whole range into inf, and inf / inf is NaN). A huge temperature gives all zeros (the uniform
    distribution); a tiny one sends all but the largest towards -inf (argmax)."""
    x = logits.double()
    return ((x - x.max()) / max(temperature, 1e-6)).to(logits.dtype)


def next_token(
    logits: torch.Tensor, greedy: bool, temperature: float, top_k: int, top_p: float, gen: torch.Generator
) -> int:
    """The next token id from 1-D fp32 ``logits``: argmax when ``greedy``; otherwise logits divided
    by ``temperature`` (when > 0; below 1e-6 counts as 1e-6), filtered, then sampled from their softmax."""
    if greedy:
        return int(torch.argmax(logits))
    if temperature > 0:
        logits = scale_logits(logits, temperature)
    logits = filter_logits(logits, top_k, top_p)
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))


def generate_tokens(
    model,
    ids: list[int],
    n: int,
    *,
    greedy: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    gen: torch.Generator,
    context: int,
    stop_id: int | None = None,
) -> tuple[list[int], bool]:
    """Up to ``n`` new token ids after ``ids`` (the model sees the last ``context`` tokens) and
    whether generation stopped at ``stop_id`` (which is not returned)."""
    dev = next(model.parameters()).device
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([out[-context:]], dtype=torch.long, device=dev)
            nxt = next_token(model(x)[0, -1].float().cpu(), greedy, temperature, top_k, top_p, gen)
            if nxt == stop_id:
                return out[len(ids) :], True
            out.append(nxt)
    return out[len(ids) :], False
