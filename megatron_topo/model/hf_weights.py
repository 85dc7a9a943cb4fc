"""Single tensors of an HF model folder by HF name: safetensors files are opened lazily (one tensor
at a time), ``pytorch_model.bin`` files are memory-mapped (``torch.load(mmap=True)``)."""

from __future__ import annotations

import os

import torch

from ..config.options import ConfigError
from ..safe_files import excerpt
from . import hf_schema


class HFWeights:
    """Read single tensors by HF name from safetensors (lazily) or pytorch_model.bin (mmap) files."""

    def __init__(self, path: str):
        self.path = path
        self._where: dict[str, str] = {}
        self._open: dict = {}
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            p = os.path.join(path, index)
            if os.path.lexists(p):  # a FIFO, folder or link out there is one line, not skipped
                self._where = hf_schema.read_weight_map(path, index)  # files inside `path` only
                self._check_index(p)
                break
        else:
            for name in ("model.safetensors", "pytorch_model.bin"):
                p = os.path.join(path, name)
                if os.path.lexists(p):  # as a file an index names: inside the folder, a regular file
                    hf_schema.inside(path, name, p, ConfigError, hf_schema.link_roots(path))
                    for k in self._keys(name):
                        self._where[k] = name
                    break

    def _check_index(self, index_path: str) -> None:
        """Every tensor the index maps to a file is in that file (only the files' headers are read:
        safetensors lazily, pytorch_model.bin memory-mapped)."""
        by_file: dict = {}
        for name, f in self._where.items():
            by_file.setdefault(f, []).append(name)
        for f, names in by_file.items():
            have = set(self._keys(f))
            lacking = [n for n in names if n not in have]
            if lacking:
                more = f" and {len(lacking) - 1} more" if len(lacking) > 1 else ""
                raise ConfigError(
                    f"{index_path}: weight_map puts {excerpt(lacking[0])}{more} in {excerpt(f)}, which holds "
                    f"no such tensor; the index does not describe the weight files"
                )

    def _file(self, name: str):
        if name not in self._open:
            p = os.path.join(self.path, name)
            try:
                if name.endswith(".safetensors"):
                    from safetensors import safe_open

                    self._open[name] = safe_open(p, framework="pt")
                else:
                    self._open[name] = torch.load(p, map_location="cpu", mmap=True, weights_only=True)
            except Exception as e:  # a damaged or foreign file: one line
                first = (str(e).strip().splitlines() or [""])[0][:200]  # torch's pickle refusals run to paragraphs
                raise ConfigError(f"{p}: cannot read the weights ({type(e).__name__}: {first})") from None
        return self._open[name]

    def _keys(self, name: str):
        f = self._file(name)
        return list(f.keys())

    def names(self) -> list:
        return list(self._where)

    def get(self, hf_name: str) -> torch.Tensor:
        f = self._file(self._where[hf_name])
        t = f.get_tensor(hf_name) if hasattr(f, "get_tensor") else f[hf_name]
        if not (t.is_floating_point() if isinstance(t, torch.Tensor) else False):
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ConfigError(
                f"{os.path.join(self.path, self._where[hf_name])}: {hf_name} is {what}, not a floating-"
                f"point tensor; model weights are float32, bfloat16 or float16"
            )
        return t
