"""What a corpus is made of: the inputs named on the command line (comma-separated lists, files,
folders, ``datasets`` folders, a hub dataset) expanded into ``Source`` records of one kind each."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Optional

from .errors import DataError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSED = (".zst", ".gz", ".xz")


@dataclass
class Source:
    kind: str  # "jsonl", "text", "parquet", "arrow", "hf_disk", "hf_load"
    path: str
    options: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path


def split_inputs(inputs: Iterable[str]) -> list[str]:
    """GPT-NeoX's ``--input a.jsonl,b.jsonl.zst``: comma-separated lists (a name that exists as
    given is kept whole, commas and all); an empty item (``a.jsonl,,b.jsonl``, ``a.jsonl,``) is refused
    naming its position, not skipped (cli.comma_items' rule)."""
    from ..cli import comma_items

    out = []
    for item in inputs:
        item = str(item)
        if os.path.exists(item) or "," not in item:
            out.append(item)
        else:
            out += comma_items(
                item, "--input", "comma-separated input files, e.g. a.jsonl,b.jsonl.zst", error=DataError, strip=False
            )
    return out


def is_saved_dataset(path: str) -> bool:
    """A folder written by ``datasets``' ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, "dataset_dict.json"))
        or (
            os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json"))
        )
    )


def file_kind(path: str) -> str:
    """'jsonl' (optionally .zst/.gz/.xz-compressed), 'parquet', 'arrow' or 'text'."""
    base = path
    for suffix in COMPRESSED:
        if path.endswith(suffix):
            base = path[: -len(suffix)]
            if not base.endswith(JSONL_SUFFIXES):
                raise DataError(
                    f"{path}: compressed inputs must be JSON lines (.jsonl{suffix}, .json{suffix}); "
                    f"decompress other files first"
                )
            return "jsonl"
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(".parquet"):
        return "parquet"
    if base.endswith(".arrow"):
        return "arrow"
    return "text"


def expand_sources(
    inputs: Iterable[str], hf_dataset: Optional[dict] = None, hf_split: Optional[str] = None
) -> list[Source]:
    """Files named directly, ``datasets`` folders, every non-hidden file under other folders
    (sorted), then the ``hf_dataset`` (``{"path", "name", "split", "data_files", "streaming",
    "cache_dir", "revision"}``) if given. ``hf_split``: the split of DatasetDict folders."""
    sources: list[Source] = []
    paths = split_inputs(inputs or [])
    if not paths and not hf_dataset:
        raise DataError(
            "no input given; pass --input FILE_OR_DIR[,...] (.jsonl[.zst|.gz|.xz], .parquet, "
            "text files, datasets folders) or --hf-dataset NAME"
        )
    split = hf_split or (hf_dataset or {}).get("split") or "train"
    for p in paths:
        if is_saved_dataset(p):
            sources.append(Source("hf_disk", p, {"split": split}))
        elif os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, f) for f in files if not f.startswith(".")]
            for f in found:  # a FIFO or a device in the folder would block or never end
                _regular_input(f)
            if not found:
                raise DataError(f"{p}: directory has no input files (empty input)")
            sources += [Source(file_kind(f), f) for f in sorted(found)]
        elif os.path.isfile(p):
            sources.append(Source(file_kind(_regular_input(p)), p))
        elif os.path.exists(p):
            _regular_input(p)
        else:
            raise DataError(
                f"{p}: no such file or directory (inputs are .jsonl[.zst|.gz|.xz], .parquet, .arrow, "
                f"text files, datasets save_to_disk folders or directories of them)"
            )
    if hf_dataset:
        spec = dict(hf_dataset)
        if is_saved_dataset(spec["path"]) and not spec.get("data_files"):
            sources.append(Source("hf_disk", spec["path"], {"split": split}))
        else:
            sources.append(Source("hf_load", spec["path"], spec))
    return sources


def _regular_input(path: str) -> str:
    """``path`` when it is a regular file (symlinks followed); a FIFO, a device or a socket is one
    line: reading it would block or never end."""
    import stat

    from ..safe_files import _kind

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise DataError(f"{path} is {_kind(mode)}, not a file; inputs are regular files (or folders of them)")
    return path
