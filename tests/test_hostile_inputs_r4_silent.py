"""Hostile inputs, round 4 (issue 29, probe 4's "silent wrong answers"): each case used to exit 0
with a wrong result and no word. Now it is one ``error:`` line (exit 2, no traceback, nothing the
run did not create changed) or the correct behaviour with a line that says what was done.

Families: a checkpoint's parameter table edited after the save (every reader: convert_to_hf,
consolidate_checkpoint, generate, resume, finetune_from); keys whose values are rounded;
keys that override others; keys whose change across a resume changes the saved state's meaning.
"""

import copy
import json
import os

import pytest

from megatron_topo.commands import consolidate_checkpoint, convert_to_hf, generate
from megatron_topo.commands import train as train_cli

from .cli_cases import build_hostile_world, call, one_error_line, scratch
from .test_hostile_inputs_r3 import snap

STEP = "ck/global_step2"
T, C, H, G = train_cli.main, consolidate_checkpoint.main, convert_to_hf.main, generate.main


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_hostile_world(tmp_path_factory.mktemp("hostile4s"))


def _unchanged(before, after):
    """Every file that was there before is there, with the same bytes."""
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert not changed, changed[:5]


def _meta_edit(fn):
    def f(d):
        p = d / STEP / "meta.json"
        m = json.loads(p.read_text())
        fn(m)
        p.write_text(json.dumps(m))

    return f


def _set(u, j, k, v):
    def fn(m):
        m["units"][u]["params"][j][k] = v

    return fn


def _swap_names(m):
    ps = m["units"][1]["params"]
    ps[0][0], ps[1][0] = ps[1][0], ps[0][0]  # two [32] tensors: the weights would silently swap


def _dup(m):
    ps = m["units"][1]["params"]
    ps[1][0] = ps[0][0]


def _drop_last(m):
    m["units"][3]["params"].pop()


def _extra(m):
    u = m["units"][3]
    u["params"].append(["head.extra.bias", u["numel"], 0, [0]])


def _numel(m):
    p = m["units"][3]["params"][2]
    p[2], p[3] = p[2] - 1, [p[2] - 1]


def _unit_numel(m):
    u = m["units"][0]
    u["numel"] = u["padded"] = u["numel"] + 2


def _drop_unit(m):
    del m["units"][2]


PARAM_TABLE = {
    "renamed": _meta_edit(_set(0, 0, 0, "no_such.weight")),
    "renamed-escape": _meta_edit(_set(0, 0, 0, "\x1b[2J" + "n" * 3000)),
    "names-swapped": _meta_edit(_swap_names),
    "duplicated": _meta_edit(_dup),
    "missing": _meta_edit(_drop_last),
    "extra": _meta_edit(_extra),
    "shape-transposed": _meta_edit(_set(1, 8, 3, [32, 128])),
    "numel-changed": _meta_edit(_numel),
    "offset-moved": _meta_edit(_set(3, 1, 1, 40)),  # overlaps: meta.json's schema
    "unit-numel": _meta_edit(_unit_numel),
    "unit-dropped": _meta_edit(_drop_unit),
}
READERS = {
    "convert": (H, ["--checkpoint", "ck", "--output", "hf2"], "hf2"),
    "consolidate-pt": (C, ["--checkpoint", "ck", "--output", "o.pt"], "o.pt"),
    "consolidate-st": (C, ["--checkpoint", "ck", "--output", "o.safetensors"], "o.safetensors"),
    "generate": (G, ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "2"], None),
}


def _refused(d, capfd, entry, argv, out=None):
    before = snap(d)
    rc = call(entry, argv)
    line = one_error_line(capfd)
    assert rc == 2, line
    assert "Traceback" not in line and "\x1b" not in line and len(line) < 600, line
    _unchanged(before, snap(d))
    if out:
        assert not os.path.exists(d / out)
    return line


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("case", sorted(PARAM_TABLE))
def test_an_edited_parameter_table_is_refused_by_every_offline_reader(world, tmp_path, monkeypatch, capfd, case, reader):
    """convert_to_hf wrote an HF export without embed_in and with no_such.weight, consolidate wrote
    the bogus name (exit 0); now the table is checked against the model config.yml builds."""
    d = scratch(world, tmp_path, monkeypatch)
    PARAM_TABLE[case](d)
    entry, argv, out = READERS[reader]
    line = _refused(d, capfd, entry, argv, out)
    assert "meta.json" in line or "does not match the saved plan" in line, line


@pytest.mark.parametrize("case", ["renamed", "names-swapped", "extra", "duplicated"])
@pytest.mark.parametrize("how", ["load", "finetune_from"])
def test_an_edited_parameter_table_is_refused_by_resume_and_finetune_from(world, tmp_path, monkeypatch, capfd, case, how):
    d = scratch(world, tmp_path, monkeypatch)
    PARAM_TABLE[case](d)
    line = _refused(d, capfd, T, ["cfg.yml", "--set", f"{how}=ck", "--set", "train_iters=3"])
    assert "meta.json" in line, line


def test_the_parameter_table_line_names_both_records(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    PARAM_TABLE["renamed"](d)
    line = _refused(d, capfd, C, ["--checkpoint", "ck", "--output", "o.pt"])
    assert "units[0].params[0] is 'no_such.weight'" in line and "'embed_in.weight'" in line, line


@pytest.mark.parametrize("reader", ["convert", "consolidate-pt"])
def test_an_unedited_checkpoint_still_exports(world, tmp_path, monkeypatch, capfd, reader):
    d = scratch(world, tmp_path, monkeypatch)
    entry, argv, out = READERS[reader]
    assert call(entry, argv) == 0
    assert os.path.exists(d / out)
