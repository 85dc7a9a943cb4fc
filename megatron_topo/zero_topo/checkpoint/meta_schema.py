"""The schema of a checkpoint's ``meta.json``, validated on read (issue 29): every field a reader uses
is declared here with its type and bounds, and a file that breaks one is refused with one line naming
the file and the field (``meta.json: step: expected an integer, got str '2'``), never a traceback or a
silently wrapped value further on.

:func:`validate` returns a :class:`Meta` (typed), which every reader uses (the checkpoint package,
the trainer, the tools and HF export); the save writes one through :meth:`Meta.to_record`.
``files`` records are required for every rank file that holds tensors unless the caller allows an
unverified load.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from .. import plan_space

SHA256 = re.compile(r"[0-9a-f]{64}")
RANK_FILE = re.compile(r"rank_[0-9]{5}\.pt")
REQUIRED = ("step", "world_size", "plan", "units", "trainer")
MAX_COUNT = 1 << 62  # steps, samples, element counts: far beyond any run, far below int64 overflow


class MetaError(ValueError):
    """One field of meta.json is wrong; ``str()`` is ``FIELD: what is wrong``."""


def _show(v: Any) -> str:
    s = repr(v)
    return f"{type(v).__name__} {s[:40] + '...' if len(s) > 40 else s}"


def _int(v: Any, where: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise MetaError(f"{where}: expected an integer, got {_show(v)}")
    if not lo <= v <= hi:
        raise MetaError(f"{where}: must lie in [{lo:,}, {hi:,}], got {v:,}")
    return v


PRECISIONS = ("fp32", "bf16", "fp16")  # what a save records (the engine's precision)
FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
TOPOLOGY_KEYS = ("world_size", "gcds_per_gpu", "gpus_per_node")
PLAN_INTS = {  # plan fields read as integers (absent in older checkpoints: not required)
    "secondary_degree": (1, 1 << 24),
    "weight_bits": (1, 64),
    "secondary_bits": (1, 64),
    "grad_bits": (1, 64),
    "combine_bits": (1, 64),
    "publish_bits": (1, 64),
    "quant_block_size": (1, MAX_COUNT),
    "grad_quant_block_size": (1, MAX_COUNT),
}
PLAN_BOOLS = ("error_feedback", "prefetch", "deterministic")
PLAN_NAMES = ("preset", "inter_node_reduce")
# the legal values of the plan's choices (zero_topo/plan_space.py, what a config may choose)
PLAN_CHOICES = {**plan_space.BITS, "preset": plan_space.PRESETS, "inter_node_reduce": plan_space.INTER_NODE_REDUCES}
PLAN_BLOCKS = ("quant_block_size", "grad_quant_block_size")
FACTORS = ("weight_factor", "grad_factor", "optimizer_factor")


def _scalar_fields(d: dict, where: str) -> None:
    """Every key of an informational record (plan, topology): a short field name, and a value that is
    null, true/false, an integer or a short printable name (no nesting, no long text)."""
    for k, v in d.items():
        if not isinstance(k, str) or not FIELD_NAME.fullmatch(k):
            raise MetaError(f"{where}: {_show(k)} is not a field name (lowercase letters, digits, _; at most 64)")
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, int):
            if abs(v) >= 1 << 63:
                raise MetaError(f"{where}.{k}: {_show(v)} is out of range")
        elif isinstance(v, str):
            if len(v) > 64 or not v.isprintable():
                raise MetaError(f"{where}.{k}: expected a short name (at most 64 printable characters), got {_show(v)}")
        else:
            raise MetaError(f"{where}.{k}: expected null, true/false, an integer or a name, got {_show(v)}")


def _plan(v: Any, ws: int) -> dict:
    plan = _dict(v, "plan")
    for k in ("weight_factor", "grad_factor", "optimizer_factor"):
        if k not in plan:
            raise MetaError(f"plan.{k}: missing")
        _int(plan[k], f"plan.{k}", 1, ws)
    _scalar_fields(plan, "plan")
    for k, (lo, hi) in PLAN_INTS.items():
        if plan.get(k) is not None:
            _int(plan[k], f"plan.{k}", lo, hi)
    for k in PLAN_BOOLS:
        if k in plan and not isinstance(plan[k], bool):
            raise MetaError(f"plan.{k}: expected true or false, got {_show(plan[k])}")
    for k in PLAN_NAMES:
        if plan.get(k) is not None and not isinstance(plan[k], str):
            raise MetaError(f"plan.{k}: expected a name, got {_show(plan[k])}")
    _plan_values(plan, ws)
    return plan


def _plan_values(plan: dict, ws: int) -> None:
    """The plan's fields hold values a plan can have (types checked before): its bit widths, block
    sizes, cross-replica reduction and preset from :mod:`..plan_space`, factors (and the secondary
    degree) that divide the world size and nest (weights within gradients within optimizer states)."""
    for k, legal in PLAN_CHOICES.items():
        if plan.get(k) is not None and plan[k] not in legal:
            raise MetaError(f"plan.{k}: expected one of {', '.join(map(str, legal))}, got {_show(plan[k])}")
    for k in PLAN_BLOCKS:
        if plan.get(k) is not None and not plan_space.is_block_size(plan[k]):
            raise MetaError(f"plan.{k}: expected {plan_space.BLOCK_SIZE_RULE}, got {_show(plan[k])}")
    for k in (*FACTORS, "secondary_degree"):
        if plan.get(k) is not None and ws % plan[k]:
            raise MetaError(f"plan.{k}: {plan[k]:,} does not divide world_size {ws:,}")
    for inner, outer in zip(FACTORS, FACTORS[1:]):
        if plan[outer] % plan[inner]:
            raise MetaError(
                f"plan.{outer}: {plan[outer]:,} is not a multiple of plan.{inner} {plan[inner]:,} (a plan's "
                f"shards nest: weights within gradients within optimizer states)"
            )
    if plan.get("deterministic") and plan.get("combine_bits", plan_space.UNQUANTIZED) < plan_space.UNQUANTIZED:
        raise MetaError(f"plan.combine_bits: {plan['combine_bits']} with plan.deterministic true; no plan has both")
    w, g, o = (plan[k] for k in FACTORS)
    if plan.get("inter_node_reduce") == "reduce_scatter" and g < ws and o != ws:
        raise MetaError(
            f"plan.inter_node_reduce: reduce_scatter with plan.optimizer_factor {o:,} below world_size {ws:,}; "
            f"no plan has both"
        )


def _topology(v: Any, ws: int) -> Optional[dict]:
    """meta.json's topology: absent/null, or {world_size, gcds_per_gpu, gpus_per_node} of this world."""
    if v is None:
        return None
    topo = _dict(v, "topology")
    for k in TOPOLOGY_KEYS:
        if k not in topo:
            raise MetaError(f"topology.{k}: missing")
        _int(topo[k], f"topology.{k}", 1, 1 << 24)
    _scalar_fields(topo, "topology")
    if topo["world_size"] != ws:
        raise MetaError(f"topology.world_size: {topo['world_size']:,} differs from world_size {ws:,}")
    per_node = topo["gcds_per_gpu"] * topo["gpus_per_node"]
    if ws % per_node:
        raise MetaError(
            f"topology: world_size {ws:,} is not a multiple of gpus_per_node x gcds_per_gpu = {per_node:,} "
            f"(ranks per node)"
        )
    return topo


def _precision(v: Any) -> Optional[str]:
    if v is None or (isinstance(v, str) and v in PRECISIONS):
        return v
    raise MetaError(f"precision: expected one of {', '.join(PRECISIONS)} (or null), got {_show(v)}")


def _rng_seed(v: Any) -> Any:
    """trainer.python_rng: absent, or a seed random.seed() takes (an integer or a short string)."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**256):
        return v
    if isinstance(v, str) and len(v) <= 256:
        return v
    raise MetaError(f"trainer.python_rng: expected an integer seed or null, got {_show(v)}")


def _dict(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise MetaError(f"{where}: expected an object, got {_show(v)}")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise MetaError(f"{where}: expected a list, got {_show(v)}")
    return v


class ParamRecord(NamedTuple):  # unpacks as meta.json's [name, offset, numel, shape]
    name: str
    offset: int
    numel: int
    shape: tuple

    def to_record(self) -> list:
        return [self.name, self.offset, self.numel, list(self.shape)]


@dataclass
class UnitRecord:
    numel: int
    padded: int
    params: list = field(default_factory=list)  # ParamRecord

    def to_record(self) -> dict:
        return {"padded": self.padded, "numel": self.numel, "params": [p.to_record() for p in self.params]}

    @classmethod
    def of(cls, table: dict) -> UnitRecord:
        """From an engine's unit table entry (:meth:`~..engine.ZeroTopoEngine.unit_table`)."""
        params = [ParamRecord(n, o, k, tuple(sh)) for n, o, k, sh in table["params"]]
        return cls(table["numel"], table["padded"], params)


@dataclass
class FileRecord:
    bytes: int
    sha256: str

    def to_record(self) -> dict:
        return {"bytes": self.bytes, "sha256": self.sha256}


@dataclass
class TrainerState:
    step: int
    consumed_samples: Optional[int] = None  # the trainer's resume requires it; offline readers do not
    consumed_valid: int = 0
    global_batch: Optional[int] = None  # samples per step; None when not recorded (or not a positive integer)
    python_rng: Any = None  # an older trainer's Python RNG seed, when recorded (not written any more)

    def to_record(self) -> dict:
        out = {
            "step": self.step,
            "consumed_samples": self.consumed_samples,
            "consumed_valid": self.consumed_valid,
            "global_batch": self.global_batch,
        }
        return {k: v for k, v in out.items() if v is not None}  # the trainer writes all four


@dataclass
class Meta:
    format: int
    step: int
    world_size: int
    plan: dict
    shard_holders: Optional[int]  # the ranks whose files hold tensors; None: not recorded (every rank's)
    units: list  # UnitRecord
    trainer: TrainerState
    files: dict  # rank file name -> FileRecord
    config: Optional[FileRecord] = None
    topology: Optional[dict] = None
    precision: Optional[str] = None
    record: dict = field(default_factory=dict, repr=False)  # the parsed file as read (copied verbatim by tools)

    @property
    def holders(self) -> int:
        """The ranks whose files hold tensors (all of them when the checkpoint does not record it)."""
        return self.shard_holders or self.world_size

    def to_record(self) -> dict:
        """meta.json's content as the save writes it (key order included)."""
        out = {
            "format": self.format,
            "step": self.step,
            "world_size": self.world_size,
            "topology": self.topology,
            "plan": self.plan,
            "precision": self.precision,
            "shard_holders": self.shard_holders,
            "units": [u.to_record() for u in self.units],
            "trainer": self.trainer.to_record(),
            "files": {n: f.to_record() for n, f in self.files.items()},
        }
        if self.config is not None:
            out["config"] = {"file": "config.yml", **self.config.to_record()}
        return out


def _param(v: Any, where: str, unit_numel: int) -> ParamRecord:
    p = _list(v, where)
    if len(p) != 4:
        raise MetaError(f"{where}: expected [name, offset, numel, shape], got {len(p)} values")
    name, off, numel, shape = p
    if not isinstance(name, str) or not name:
        raise MetaError(f"{where}[0] (name): expected a parameter name, got {_show(name)}")
    off = _int(off, f"{where}[1] (offset)", 0, unit_numel)
    numel = _int(numel, f"{where}[2] (numel)", 0, unit_numel)
    dims = tuple(_int(d, f"{where}[3] (shape)", 0, MAX_COUNT) for d in _list(shape, f"{where}[3] (shape)"))
    if math.prod(dims) != numel:
        raise MetaError(f"{where}: shape {list(dims)} has {math.prod(dims):,} elements, numel says {numel:,}")
    if off + numel > unit_numel:
        raise MetaError(f"{where}: [{off:,}, {off + numel:,}) runs past the unit's {unit_numel:,} elements")
    return ParamRecord(name, off, numel, dims)


def _unit(v: Any, where: str, ws: int, plan: dict) -> UnitRecord:
    u = _dict(v, where)
    for k in ("numel", "padded", "params"):
        if k not in u:
            raise MetaError(f"{where}.{k}: missing")
    numel = _int(u["numel"], f"{where}.numel")
    padded = _int(u["padded"], f"{where}.padded", numel)
    most = ws * plan_space.MAX_BLOCK_SIZE  # padding: to a multiple of world size x the largest block
    if padded - numel > most:
        raise MetaError(
            f"{where}.padded: {padded:,} pads numel {numel:,} by more than a plan on {ws:,} ranks does "
            f"(at most {most:,})"
        )
    if padded % plan["optimizer_factor"]:
        raise MetaError(
            f"{where}.padded: {padded:,} is not a multiple of plan.optimizer_factor {plan['optimizer_factor']:,} "
            f"(each optimizer shard is an equal slice of it)"
        )
    params = [_param(p, f"{where}.params[{j}]", numel) for j, p in enumerate(_list(u["params"], f"{where}.params"))]
    end = 0
    for j, p in sorted(enumerate(params), key=lambda t: t[1].offset):
        if p.offset < end:
            raise MetaError(f"{where}.params[{j}] ({p.name}): offset {p.offset:,} overlaps the parameter before it")
        end = p.offset + p.numel
    return UnitRecord(numel, padded, params)


def _file(v: Any, where: str) -> FileRecord:
    r = _dict(v, where)
    if "bytes" not in r or "sha256" not in r:
        raise MetaError(f"{where}: expected {{bytes, sha256}}, got keys {sorted(map(str, r))[:4]}")
    if not isinstance(r["sha256"], str) or not SHA256.fullmatch(r["sha256"]):
        raise MetaError(f"{where}.sha256: expected 64 lowercase hex digits, got {_show(r['sha256'])}")
    return FileRecord(_int(r["bytes"], f"{where}.bytes"), r["sha256"])


ASK_UNVERIFIED = "set load_unverified: true"  # training's key; the tools pass their flag


def validate(meta: dict, supported_formats: tuple, unverified: bool = False, ask: str = ASK_UNVERIFIED) -> Meta:
    """The typed :class:`Meta` of ``meta`` (a parsed meta.json), or MetaError for the first bad field;
    ``ask`` is how the reading tool asks for an unverified load (its key or flag)."""
    fmt = meta.get("format", 1)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt not in supported_formats:  # 2e0 is not format 2
        raise MetaError(
            f"format: checkpoint format {fmt!r} is not supported; this megatron_topo reads formats "
            f"{', '.join(map(str, supported_formats))} (saved by another version?)"
        )
    for k in REQUIRED:
        if k not in meta:
            raise MetaError(f"{k}: missing (the file is incomplete)")
    step = _int(meta["step"], "step")
    ws = _int(meta["world_size"], "world_size", 1, 1 << 24)
    plan = _plan(meta["plan"], ws)
    topology, precision = _topology(meta.get("topology"), ws), _precision(meta.get("precision"))
    holders = meta.get("shard_holders")  # absent or null: every rank holds a shard (0 is not absent)
    if holders is not None:
        holders = _int(holders, "shard_holders", 1, ws)
        if holders != plan["optimizer_factor"]:  # the save records the ranks 0 .. optimizer_factor-1
            raise MetaError(
                f"shard_holders: {holders:,} differs from plan.optimizer_factor {plan['optimizer_factor']:,} "
                f"(the ranks whose files hold the optimizer shards)"
            )
    units = [_unit(u, f"units[{i}]", ws, plan) for i, u in enumerate(_list(meta["units"], "units"))]
    tr = _dict(meta["trainer"], "trainer")
    if "step" not in tr:
        raise MetaError("trainer.step: missing")
    consumed = tr.get("consumed_samples")
    kept = tr.get("global_batch")  # read by a resume on another world size only when a positive integer
    if kept is not None:  # a field that is there is valid (a string there was skipped without a word)
        _int(kept, "trainer.global_batch", 1)
    trainer = TrainerState(
        _int(tr["step"], "trainer.step"),
        None if consumed is None else _int(consumed, "trainer.consumed_samples"),
        _int(tr.get("consumed_valid", 0), "trainer.consumed_valid"),
        kept if isinstance(kept, int) and not isinstance(kept, bool) and kept >= 1 else None,
        _rng_seed(tr.get("python_rng")),
    )
    if trainer.step != step:
        raise MetaError(f"trainer.step: {trainer.step} differs from step {step}")
    files = {}
    raw_files = meta.get("files")
    if raw_files is not None:
        for name, rec in _dict(raw_files, "files").items():
            if not RANK_FILE.fullmatch(str(name)):
                raise MetaError(f"files: {str(name)[:40]!r} is not a rank file name (rank_NNNNN.pt)")
            files[name] = _file(rec, f"files.{name}")
    if not unverified:
        lacking = [f"rank_{r:05d}.pt" for r in range(ws) if f"rank_{r:05d}.pt" not in files]
        if lacking:
            raise MetaError(
                f"files: no size and SHA-256 recorded for {lacking[0]}"
                f"{f' and {len(lacking) - 1} more' if len(lacking) > 1 else ''}, so its bytes cannot be "
                f"verified; refusing to load it ({ask} to load it anyway)"
            )
    config = None
    if meta.get("config") is not None:
        config = _file(meta["config"], "config")
        name = meta["config"].get("file", "config.yml")
        if name != "config.yml":
            raise MetaError(f"config.file: expected 'config.yml' (the file a save writes), got {_show(name)}")
    return Meta(fmt, step, ws, plan, holders, units, trainer, files, config, topology, precision, meta)
