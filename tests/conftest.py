import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Triton decorates its own library functions (tl.max, ...) when `triton` is first imported, and
# torch._dynamo (pulled in by the first fused AdamW) imports triton early: the interpreter switch
# must be on before any test module loads, or the kernels run interpreted while tl.* do not.
os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """Slow benchmarks run only when asked for with `-m slow`."""
    import pytest

    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `-m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
