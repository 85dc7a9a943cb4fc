"""Quantized payload and block scales in one buffer, so one collective moves both (docs/design.md §5).

A quantized collective over d ranks sends ``parts`` equal pieces (one per destination for an
all-to-all, one for an all-gather). Each piece is laid out as its payload bytes followed by its
fp32 scales' bytes::

    [ payload piece 0 | scales piece 0 | payload piece 1 | scales piece 1 | ... ]   (uint8)

so an all-to-all delivers to every rank its payload slice and the matching scales together, and
an all-gather's output is the concatenation of every rank's piece. The bytes on the wire are the
payload's plus the scales', exactly as when they travelled as two collectives; the launches halve.
"""

from __future__ import annotations

import torch


def pack(q: torch.Tensor, scales: torch.Tensor, parts: int = 1) -> torch.Tensor:
    """One uint8 buffer of ``parts`` pieces ``[payload_i | scales_i]`` (q and scales cut in
    ``parts`` equal slices)."""
    qb = q.reshape(-1).view(torch.uint8).view(parts, -1)
    sb = scales.reshape(-1).view(torch.uint8).view(parts, -1)
    return torch.cat([qb, sb], dim=1).reshape(-1)


def empty_like_packed(q: torch.Tensor, scales: torch.Tensor, parts: int) -> torch.Tensor:
    """A receive buffer for ``parts`` pieces of the size of (``q``, ``scales``)."""
    n = q.numel() * q.element_size() + scales.numel() * scales.element_size()
    return torch.empty(n * parts, dtype=torch.uint8, device=q.device)


def unpack(buf: torch.Tensor, parts: int, q_nbytes: int, q_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``parts`` pieces back into (payload, scales), each contiguous, piece after piece;
    ``q_nbytes`` is the payload bytes of one piece."""
    rows = buf.view(parts, -1)
    q = rows[:, :q_nbytes].contiguous().view(q_dtype).reshape(-1)
    scales = rows[:, q_nbytes:].contiguous().view(torch.float32).reshape(-1)
    return q, scales
