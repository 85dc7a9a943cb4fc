"""Memory you can trust on a device (issue 27 item 3): the engine frees its transport buffers when
a collective is done (no reference cycle waits for Python's collector), the preflight counts every
buffer the engine holds at its peak (upper bound of the dry run's measured peak, phase by phase)
and keeps a stated reserve per system file for what no tensor counts."""
import gc
import weakref

import torch

from megatron_topo.zero_topo.comm import Handle, TwoStageHandle


class _TwoStage(TwoStageHandle):
    """A two-stage handle like TwoHopReduce / QuantizedCombine: buffers as attributes, stages as
    bound methods."""

    def __init__(self):
        self.buf = torch.zeros(1000)
        super().__init__([], self._second, self._finish)

    def _second(self):
        self.buf2 = torch.zeros(1000)
        return []

    def _finish(self):
        return self.buf.sum()


def test_a_finished_two_stage_handle_is_freed_without_the_cyclic_collector():
    was = gc.isenabled()
    gc.disable()
    try:
        h = _TwoStage()
        ref = weakref.ref(h)
        h.wait()
        del h
        assert ref() is None  # on 1d0c977 the bound methods kept it (and its buffers) alive
        one = Handle([], lambda: 1)
        ref = weakref.ref(one)
        one.wait()
        del one
        assert ref() is None
    finally:
        if was:
            gc.enable()
