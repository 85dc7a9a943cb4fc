"""data/worker_pool.stop_signals_held: a SIGTERM while the preprocessing workers start is acted on
once they are up. Before, the tool's handler raised in the middle of writing a spawned worker's
preparation data, and the half-started worker printed an EOFError traceback beside the tool's one
line (tests/test_hostile_inputs_r5_tools.py::test_a_stopped_bench_data_leaves_no_process_and_no_corpus,
seen in CI)."""

import os
import signal

import pytest

from megatron_topo.data.worker_pool import stop_signals_held


class Stopped(Exception):
    pass


def _raise(signum, frame):
    raise Stopped(signum)


def test_a_stop_signal_inside_is_acted_on_when_leaving():
    old = signal.signal(signal.SIGTERM, _raise)
    try:
        reached = []
        with pytest.raises(Stopped):
            with stop_signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                reached.append("after the signal")  # still inside: not interrupted
        assert reached == ["after the signal"]
        assert signal.getsignal(signal.SIGTERM) is _raise  # the handler is back
    finally:
        signal.signal(signal.SIGTERM, old)


def test_without_a_signal_nothing_happens():
    old = signal.signal(signal.SIGHUP, _raise)
    try:
        with stop_signals_held():
            pass
        assert signal.getsignal(signal.SIGHUP) is _raise
    finally:
        signal.signal(signal.SIGHUP, old)
