"""Which unit shards which parameter: pure bookkeeping the engine does once, before any unit is
built. A parameter belongs to the first unit that holds it; a later unit that holds the same
tensor (tied weights, e.g. input embedding and output layer) borrows it from that owner."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

# (borrowing unit position, name there, owning unit position, name there)
Tie = tuple[int, str, int, str]


def assign_parameters(
    model: nn.Module, units: Sequence[nn.Module]
) -> tuple[list[list[tuple[str, nn.Parameter]]], list[Tie]]:
    """Per unit (in ``units`` order) the (name, parameter) pairs it shards, and the ties of
    parameters it borrows. Frozen parameters are left out. Raises ValueError for a parameter that
    appears twice in one unit or a trainable parameter of ``model`` outside every unit."""
    seen: dict[int, tuple[int, str]] = {}  # parameter -> (unit position, name in that unit)
    unit_params: list[list[tuple[str, nn.Parameter]]] = []
    tied: list[Tie] = []
    for i, mod in enumerate(units):
        params = []
        for n, p in mod.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                continue
            if id(p) in seen:  # tied weights: sharded once, by the first unit that has them
                owner, owner_name = seen[id(p)]
                if owner == i:
                    raise ValueError(f"parameter '{n}' appears twice in one unit")
                tied.append((i, n, owner, owner_name))
                continue
            seen[id(p)] = (i, n)
            params.append((n, p))
        unit_params.append(params)
    leftovers = [n for n, p in model.named_parameters() if id(p) not in seen and p.requires_grad]
    if leftovers:
        raise ValueError(f"parameters outside every unit: {', '.join(leftovers[:5])}")
    return unit_params, tied


def tie_borrowed(units: Sequence[nn.Module], by_pos: dict, tied: list[Tie]) -> None:
    """Point each borrowing unit at its owner's parameter (which sharded init may have replaced)
    and record the owner among the borrower's ``borrows``, so it is gathered whenever the
    borrower computes. ``by_pos``: unit position -> ShardedUnit (units without parameters absent)."""
    for i, n, owner, owner_name in tied:
        spec = next(s for s in by_pos[owner].specs if s.name == owner_name)
        where, _, leaf = n.rpartition(".")
        (units[i].get_submodule(where) if where else units[i])._parameters[leaf] = spec.param
        if i in by_pos and by_pos[owner] not in by_pos[i].borrows:
            by_pos[i].borrows.append(by_pos[owner])


def tensors(x: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a module's output (nested lists, tuples, dicts)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from tensors(y)
