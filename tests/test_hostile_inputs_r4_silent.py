"""Hostile inputs, round 4 (issue 29, probe 4's "silent wrong answers"): each case used to exit 0
with a wrong result and no word. Now it is one ``error:`` line (exit 2, no traceback, nothing the
run did not create changed) or the correct behaviour with a line that says what was done.

Families: a checkpoint's parameter table edited after the save (every reader: convert_to_hf,
consolidate_checkpoint, generate, resume, finetune_from); keys whose values are rounded;
keys that override others; keys whose change across a resume changes the saved state's meaning.
"""

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
def test_an_edited_parameter_table_is_refused_by_every_offline_reader(
    world, tmp_path, monkeypatch, capfd, case, reader
):
    """convert_to_hf wrote an HF export without embed_in and with no_such.weight, consolidate wrote
    the bogus name (exit 0); now the table is checked against the model config.yml builds."""
    d = scratch(world, tmp_path, monkeypatch)
    PARAM_TABLE[case](d)
    entry, argv, out = READERS[reader]
    line = _refused(d, capfd, entry, argv, out)
    assert "meta.json" in line or "does not match the saved plan" in line, line


@pytest.mark.parametrize("case", ["renamed", "names-swapped", "extra", "duplicated"])
@pytest.mark.parametrize("how", ["load", "finetune_from"])
def test_an_edited_parameter_table_is_refused_by_resume_and_finetune_from(
    world, tmp_path, monkeypatch, capfd, case, how
):
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


# ------------------------------------------------------------------------------ rounded values
def _cfg(*sets):
    from megatron_topo.config import load_config

    return load_config(["cfg.yml"], list(sets))


@pytest.mark.parametrize(
    "pct, needle",
    [
        ("0.375", "= 3 rotary dims, an odd count"),  # 3 dims: GPT-NeoX and HF fail, ours dropped one more
        ("0.125", "= 1 rotary dims, an odd count"),
        ("0.1", "= 0.8 -> 0 rotary dims: the model would have no position information"),
        ("0", "= 0 rotary dims: the model would have no position information"),
    ],
)
def test_a_rotary_pct_giving_odd_or_no_rotary_dims_is_refused(world, tmp_path, monkeypatch, capfd, pct, needle):
    d = scratch(world, tmp_path, monkeypatch)
    line = _refused(d, capfd, T, ["cfg.yml", "--set", f"rotary_pct={pct}", "--set", "train_iters=1"])
    assert f"rotary_pct {float(pct):g} of head dim 8 {needle}" in line and "use e.g. rotary_pct 0.25" in line, line


def test_a_head_of_one_dim_has_no_rotary_pair(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    line = _refused(d, capfd, T, ["cfg.yml", "--set", "num_attention_heads=32", "--set", "rotary_pct=1"])
    assert (
        "rotary_pct 1 of head dim 1 = 1 rotary dims, an odd count" in line and "use fewer num_attention_heads" in line
    )


def test_a_fractional_rotary_dim_count_is_noted(world, tmp_path, monkeypatch, capfd):
    """rotary_pct 0.3 of head dim 8 is 2.4 dims: 2 are used, as GPT-NeoX and HF do; said once."""
    scratch(world, tmp_path, monkeypatch)
    from megatron_topo.config.output import note_lines
    from megatron_topo.model.gpt_neox import rotary_inv_freq

    cfg = _cfg("rotary_pct=0.3")
    assert rotary_inv_freq(cfg.model).numel() * 2 == 2
    assert "note: rotary_pct 0.3 of head dim 8 = 2.4: 2 dims are rotary" in "\n".join(note_lines(cfg))
    assert not [x for x in note_lines(_cfg("rotary_pct=0.25")) if "rotary" in x]
    assert call(T, ["cfg.yml", "--set", "rotary_pct=0.3", "--dry-run"]) == 0
    assert "2 dims are rotary" in capfd.readouterr().out


def test_a_warmup_fraction_that_is_not_whole_steps_is_noted(world, tmp_path, monkeypatch):
    """warmup 0.015 of 100 steps is 1.5 steps; 1 warms up (int(), as GPT-NeoX): said in a note."""
    scratch(world, tmp_path, monkeypatch)
    from megatron_topo.config.output import note_lines
    from megatron_topo.training.batches import learning_rate

    cfg = _cfg("warmup=0.015", "train_iters=100")
    assert learning_rate(cfg, 1) == cfg.train.optimizer.params.lr  # 1 warmup step: full lr at step 1
    assert "note: warmup 0.015 of train_iters 100 = 1.5 steps: 1 steps warm up" in "\n".join(note_lines(cfg))
    for sets in (("warmup=0.01", "train_iters=100"), ("warmup_iters=3", "train_iters=7"), ("train_iters=7",)):
        assert not [x for x in note_lines(_cfg(*sets)) if "warmup" in x], sets


# ------------------------------------------------------------------------------ keys that override others
def test_train_data_paths_over_data_path_is_noted(world, tmp_path, monkeypatch, capfd):
    """GPT-NeoX reads train_data_paths and ignores data_path and split; that is said, not silent."""
    scratch(world, tmp_path, monkeypatch)
    from megatron_topo.config.output import note_lines

    notes = "\n".join(note_lines(_cfg("train_data_paths=[data/other]")))
    assert "note: train_data_paths is set, so data_path data/toy and split 100,0,0 are not used" in notes, notes
    assert not [x for x in note_lines(_cfg("data_path=data/other")) if "train_data_paths" in x]
    assert call(T, ["cfg.yml", "--set", "train_data_paths=[data/other]", "--set", "train_iters=1"]) == 0
    assert "data_path data/toy and split 100,0,0 are not used" in capfd.readouterr().out


def test_loads_modifiers_without_load_are_noted(world, tmp_path, monkeypatch):
    """finetune / no_load_optim change what `load` loads; without load they did nothing, silently."""
    scratch(world, tmp_path, monkeypatch)
    from megatron_topo.config.output import note_lines

    def notes(*sets):
        return [x for x in note_lines(_cfg(*sets)) if "load, and" in x]

    assert notes("finetune=true") == ["note: finetune: true only modifies load, and load is not set: no effect"]
    assert "no_load_optim: true" in notes("no_load_optim=true", "finetune_from=ck")[0]
    assert "finetune_from already starts from weights alone" in notes("no_load_optim=true", "finetune_from=ck")[0]
    assert notes("finetune=true", "load=ck") == [] and notes() == []


def test_keys_that_replace_others_are_still_refused_together(world, tmp_path, monkeypatch):
    """The pairs already refused stay refused (one line each)."""
    from megatron_topo.config import ConfigError

    scratch(world, tmp_path, monkeypatch)
    for sets, needle in (
        (("warmup_iters=1", "warmup=0.5"), "warmup_iters and warmup both set"),
        (("decay_lr_to=0.1", "min_lr=0.0001"), "decay_lr_to and min_lr both set"),
        (("finetune_from=ck", "load=ck"), "both name the starting point"),
    ):
        with pytest.raises(ConfigError, match=needle):
            _cfg(*sets)


# ------------------------------------------------------------------------------ resume with changed keys
RESUME = ["cfg.yml", "--set", "load=ck", "--set", "train_iters=3", "--set", "log_dir=lg"]


def _resume(capfd, *sets):
    argv = list(RESUME)
    for s in sets:
        argv += ["--set", s]
    rc = call(T, argv)
    out = capfd.readouterr()
    return rc, out.out + out.err


def _last_loss(d):
    recs = [json.loads(x) for x in (d / "lg" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in recs if r.get("step") == 3 and "loss" in r][-1]


@pytest.mark.parametrize(
    "sets", [["seq_length=8"], ["seq_length=8", "max_position_embeddings=8"], ["seq_length=8", "no_load_optim=true"]]
)
def test_a_resume_with_another_seq_length_is_refused(world, tmp_path, monkeypatch, capfd, sets):
    """consumed_samples counted 16-token samples: resuming at 8 reinterpreted the data position."""
    d = scratch(world, tmp_path, monkeypatch)
    argv = list(RESUME)
    for s in sets:
        argv += ["--set", s]
    line = _refused(d, capfd, T, argv)
    assert "seq_length 8 differs from the checkpoint's 16" in line and "finetune_from=ck" in line, line


def test_another_seq_length_from_the_checkpoints_weights_is_a_fine_tune(world, tmp_path, monkeypatch, capfd):
    scratch(world, tmp_path, monkeypatch)
    assert call(T, ["cfg.yml", "--set", "finetune_from=ck", "--set", "seq_length=8", "--set", "train_iters=1"]) == 0


@pytest.mark.parametrize("sets", [["train_micro_batch_size_per_gpu=4"], ["train_micro_batch_size_per_gpu=3"]])
def test_a_resume_whose_micro_batch_cannot_keep_the_global_batch_is_refused(world, tmp_path, monkeypatch, capfd, sets):
    """The global batch went from 2 to 4 without a line; the README says a resumed run keeps it."""
    d = scratch(world, tmp_path, monkeypatch)
    argv = list(RESUME)
    for s in sets:
        argv += ["--set", s]
    line = _refused(d, capfd, T, argv)
    assert "global batch 2 (the checkpoint's" in line and "set train_batch_size to change" in line, line


@pytest.mark.parametrize(
    "sets, line",
    [
        (["train_micro_batch_size_per_gpu=1"], "gradient_accumulation_steps 1 -> 2"),
        (["gradient_accumulation_steps=2"], "gradient_accumulation_steps 2 -> 1"),
    ],
)
def test_a_resume_keeps_the_global_batch_and_says_so(world, tmp_path, monkeypatch, capfd, sets, line):
    """Another micro-batch or accumulation count: the saved global batch is kept (the accumulation is
    derived, with a line), so step 3 trains on the same samples: the same loss, bit for bit."""
    d = scratch(world, tmp_path, monkeypatch)
    rc, text = _resume(capfd)
    assert rc == 0, text[-2000:]
    ref = _last_loss(d)
    (d / "lg").rename(d / "lg0")
    rc, text = _resume(capfd, *sets)
    assert rc == 0, text[-2000:]
    assert "global batch 2 (the checkpoint's; set train_batch_size to change it)" in text and line in text, text
    assert "global batch 2 x 16 tokens" in text
    assert _last_loss(d) == ref


@pytest.mark.parametrize(
    "sets, needle",
    [
        (["data_path=data/other"], "other data keys than the checkpoint's (data_path 'data/toy' -> 'data/other')"),
        (["seed=5"], "other data keys than the checkpoint's (seed 1234 -> 5)"),
        (["optimizer.params.lr=0.002"], "another learning-rate schedule than the checkpoint's (lr 0.001 -> 0.002)"),
        (["train_batch_size=4"], "global batch 4 (train_batch_size) differs from the checkpoint's 2"),
    ],
)
def test_a_resume_with_changed_data_schedule_or_batch_says_so(world, tmp_path, monkeypatch, capfd, sets, needle):
    scratch(world, tmp_path, monkeypatch)
    rc, text = _resume(capfd, *sets)
    assert rc == 0, text[-2000:]
    assert "note: " + needle in text or needle in text, text[-3000:]


def test_a_plain_resume_prints_no_change_note(world, tmp_path, monkeypatch, capfd):
    scratch(world, tmp_path, monkeypatch)
    rc, text = _resume(capfd)
    assert rc == 0, text[-2000:]
    assert "note: resuming" not in text and "the checkpoint's" not in text, text[-3000:]
