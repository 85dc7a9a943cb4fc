"""unit_params.assign_parameters: which unit shards which parameter (pure; the engine's first step)."""

import pytest
import torch.nn as nn

from megatron_topo.zero_topo.unit_params import assign_parameters, tensors


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2 style models do
        self.mid.bias.requires_grad_(False)  # frozen: sharded by nobody


def test_owner_is_the_first_unit_and_later_ones_borrow():
    m = Tied()
    unit_params, tied = assign_parameters(m, [m.embed, m.mid, m.head])
    assert [[n for n, _ in ps] for ps in unit_params] == [["weight"], ["weight"], []]
    assert tied == [(2, "weight", 0, "weight")]


def test_a_trainable_parameter_outside_every_unit_is_refused():
    m = Tied()
    with pytest.raises(ValueError, match=r"parameters outside every unit: mid\.weight"):
        assign_parameters(m, [m.embed, m.head])


def test_a_parameter_twice_in_one_unit_is_refused():
    m = Tied()
    both = nn.ModuleList([m.embed, m.head])
    with pytest.raises(ValueError, match="appears twice in one unit"):
        assign_parameters(m, [both, m.mid])


def test_tensors_finds_nested_outputs():
    import torch

    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [t.item() for t in tensors({"x": (a, [b]), "y": c, "z": "text"})] == [0.0, 1.0, 2.0]
