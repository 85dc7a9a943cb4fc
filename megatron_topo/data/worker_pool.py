"""The preprocessing worker pool, started whole before a stop signal is acted on.

A spawned worker reads its preparation data from a pipe the parent writes while it starts the
process. A SIGTERM/SIGHUP whose handler raised in the middle of that write (preprocess_data and
bench_data unwind on both) closed the pipe early, and the half-started worker printed
``EOFError: Ran out of input`` with a traceback beside the tool's own one line. So the signals
are held while the workers start (a few seconds at most) and acted on as soon as they are up.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator

STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Inside: SIGTERM/SIGHUP are recorded, not acted on; on leaving, the previous handlers are
    back and a recorded signal is raised again, so it does what it would have done (an unwinding
    handler raises, the default one ends the process). A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.signal(s, lambda n, _f: got.append(n)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if got:
            signal.raise_signal(got[0])


def start_pool(workers: int, initializer: Callable, initargs: tuple) -> ProcessPoolExecutor:
    """``workers`` spawned processes (no forked tokenizer state), each started and initialised
    before this returns; a stop signal meanwhile is acted on once they are (:func:`stop_signals_held`)."""
    with stop_signals_held():
        pool = ProcessPoolExecutor(
            workers, mp_context=mp.get_context("spawn"), initializer=initializer, initargs=initargs
        )
        try:
            for f in [pool.submit(os.getpid) for _ in range(workers)]:
                f.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return pool
