"""Process liveness on this host (no psutil)."""

from __future__ import annotations

import os

# Linux's PID_MAX_LIMIT (4,194,304, the most /proc/sys/kernel/pid_max can be set to); other
# systems stay far below it. A pid outside 1..PID_MAX (read from a lock or a file name) names no process.
PID_MAX = 1 << 22


def valid_pid(pid) -> bool:
    """Whether ``pid`` (read from a file: any JSON value) can be a process id of this system."""
    return isinstance(pid, int) and not isinstance(pid, bool) and 1 <= pid <= PID_MAX


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here (another user's counts: signal 0 is refused).
    A value that cannot be a pid (0, negative, huge, not an int) is no process: False, never
    a signal to a process group (``kill(0)``, ``kill(-1)``) or an OverflowError."""
    if not valid_pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
