import os

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """Slow benchmarks run only when asked for with `-m slow`."""
    import pytest

    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `-m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
