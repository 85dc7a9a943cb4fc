"""torchrun without its traceback.

    python -m megatron_topo.launch --standalone --nproc_per_node 8 train.py CONFIG.yml ...

runs torchrun (``torch.distributed.run``) with the same arguments. When a rank fails, torchrun
raises ``ChildFailedError`` and prints its traceback and a table of the failed ranks, after the
rank has printed its own one-line ``error:`` (once per job: megatron_topo.commands.train); this
launcher exits with the first failed rank's status instead (128 + N for a rank killed by signal N).
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        code = failure.exitcode
        return code if code > 0 else (128 - code if code < 0 else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
