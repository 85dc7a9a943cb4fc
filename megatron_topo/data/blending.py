"""Megatron's blending of several datasets with weights.

Sample ``i`` of the blend comes from the dataset whose share so far lags its weight the most
(``argmax_d weight_d * max(i, 1) - taken_d``, first on ties): a deterministic interleaving whose
counts track the weights within one sample at every prefix. Each dataset is asked for
``ceil(weight * num_samples * 1.005)`` samples, as GPT-NeoX/Megatron do.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from .cache import IndexCache, MappedArrays, short_hash
from .errors import DataError

BLEND_VERSION = 1


def normalize_weights(weights: Optional[Sequence[float]], n: int, what: str) -> list[float]:
    if weights is None:
        weights = [1.0] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise DataError(f"{what}: {len(weights)} weights for {n} datasets; give one weight per path")
    if any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise DataError(
            f"{what}: weights {weights} must all be positive finite numbers (leave a path out "
            f"rather than giving it weight 0)"
        )
    total = sum(weights)
    return [w / total for w in weights]


def samples_per_dataset(weights: Sequence[float], num_samples: int) -> list[int]:
    return [int(math.ceil(num_samples * w * 1.005)) for w in weights]


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset index per sample, sample index inside that dataset), Megatron's helpers.cpp."""
    n = len(weights)
    dataset_index = np.empty(size, np.uint8 if n < 256 else np.int32)
    dataset_sample_index = np.empty(size, np.int64)
    w = [float(x) for x in weights]
    if n > _VECTOR_FROM:
        return _blending_indices_wide(w, size, dataset_index, dataset_sample_index)
    taken = [0] * n
    rest = range(1, n)
    block = 1 << 20
    with tqdm(
        total=size, desc="blending indices", unit="sample", unit_scale=True, disable=size < 8 * block
    ) as bar:  # pure Python: ~0.3 s per million samples
        for lo in range(0, size, block):
            hi = min(size, lo + block)
            ds_out, sample_out = [0] * (hi - lo), [0] * (hi - lo)
            for i in range(lo, hi):
                x = i or 1  # max(i, 1)
                best, best_err = 0, w[0] * x - taken[0]
                for d in rest:
                    err = w[d] * x - taken[d]
                    if err > best_err:
                        best, best_err = d, err
                ds_out[i - lo] = best
                sample_out[i - lo] = taken[best]
                taken[best] += 1
            dataset_index[lo:hi] = ds_out
            dataset_sample_index[lo:hi] = sample_out
            bar.update(hi - lo)
    return dataset_index, dataset_sample_index


_VECTOR_FROM = 32  # datasets from which one numpy argmax per sample beats the Python loop


def _blending_indices_wide(w: list, size: int, dataset_index, dataset_sample_index):
    """``build_blending_indices`` for many datasets: the same float64 products, differences and
    first-maximum rule, one numpy argmax per sample (thousands of datasets: O(datasets) in C per
    sample, not in Python)."""
    wa, taken = np.asarray(w, np.float64), np.zeros(len(w), np.float64)
    with tqdm(total=size, desc="blending indices", unit="sample", unit_scale=True, disable=size < (1 << 20)) as bar:
        for i in range(size):
            best = int(np.argmax(wa * float(i or 1) - taken))
            dataset_index[i] = best
            dataset_sample_index[i] = int(taken[best])
            taken[best] += 1.0
            if i & 0xFFFF == 0xFFFF:
                bar.update(1 << 16)
    return dataset_index, dataset_sample_index


class BlendedDataset(MappedArrays):
    """``len(ds) == num_samples``; ``ds[i]`` is sample ``dataset_sample_index[i]`` of dataset
    ``dataset_index[i]``."""

    def __init__(
        self,
        name: str,
        datasets: list,
        weights: Sequence[float],
        num_samples: int,
        cache: Optional[IndexCache],
        cache_key: Optional[dict] = None,
    ):
        self.name, self.datasets, self.weights, self.size = name, datasets, list(weights), num_samples
        from .gpt_dataset import available_memory_bytes

        need, have = num_samples * 9, available_memory_bytes()
        if need > have:
            raise DataError(
                f"{name} blend: {num_samples:,} samples need {need / 2**30:,.1f} GiB of blending "
                f"indices, more than the {have / 2**30:,.1f} GiB of memory available; lower train_iters"
            )

        def build():
            di, si = build_blending_indices(self.weights, num_samples)
            return {"dataset_index": di, "dataset_sample_index": si}

        keys = ("dataset_index", "dataset_sample_index")
        if cache is None:
            arrays = build()
        else:
            params = {
                "version": BLEND_VERSION,
                "weights": self.weights,
                "num_samples": num_samples,
                "datasets": cache_key or {},
            }
            tag = f"blend_{name}_{num_samples}ns_{short_hash(params)}"
            arrays = cache.get(tag, params, keys, build)
            self._mapped = cache.paths(tag, keys)[1]
        self.dataset_index, self.dataset_sample_index = arrays["dataset_index"], arrays["dataset_sample_index"]
        counts = np.bincount(np.asarray(self.dataset_index), minlength=len(datasets))
        for d, (c, ds) in enumerate(zip(counts, datasets)):
            if c > len(ds):
                raise DataError(f"{name} blend: dataset {d} is asked for {c} samples but has {len(ds)}")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx) -> np.ndarray:
        idx = int(idx)
        if not 0 <= idx < self.size:
            raise IndexError(f"{self.name} sample {idx} out of range ({self.size} samples)")
        return self.datasets[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]
