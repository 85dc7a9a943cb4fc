"""The network-namespace commands of the emulated cluster: run ``ip``/``tc`` with one-line errors,
list and delete our namespaces (``mtemu-{pid}-{n}...``, those of dead runs included), and check that
namespaces, veths and HTB can be created here."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Optional

from ...pids import pid_alive

PREFIX = "mtemu"
ETC_NETNS = "/etc/netns"  # `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts
_TAG_RE = re.compile(rf"^{PREFIX}-(\d+)-")


class EmulationError(RuntimeError):
    """Setting up or tearing down the emulated cluster failed; the message is one line."""


# ---------------------------------------------------------------------------------- commands
def _run(args: list[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout).strip().replace("\n", " | ")
        raise EmulationError(f"`{' '.join(args)}` failed: {err}")
    return p


def list_namespaces() -> list[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def namespace_pids(ns: str) -> list[int]:
    p = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def _kill_namespace(ns: str) -> None:
    """SIGKILL what still runs inside one of our namespaces (ranks we launched), then delete it."""
    for _ in range(3):
        pids = namespace_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.2)
    _run(["ip", "netns", "del", ns], check=False)
    shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)


def cleanup_leftovers(include_live: bool = False) -> list[str]:
    """Remove namespaces left by emulator runs whose process is gone (or all of ours with
    ``include_live``). Returns the names removed."""
    removed = []
    for ns in list_namespaces():
        m = _TAG_RE.match(ns)
        if not m:
            continue
        pid = int(m.group(1))
        if include_live or (pid != os.getpid() and not pid_alive(pid)):
            _kill_namespace(ns)
            removed.append(ns)
    return removed


def check_privileges() -> Optional[str]:
    """None when namespaces, veths and HTB can be created here, else the reason (one line)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN); running as uid {os.geteuid()}"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        p = _run(["ip", "netns", "add", probe], check=False)
        if p.returncode != 0:
            msg = (p.stderr or p.stdout).strip()
            return f"`ip netns add` failed: {msg.splitlines()[-1] if msg else 'unknown error'}"
        _run(["ip", "-n", probe, "link", "set", "lo", "up"], check=False)
        q = _run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"], check=False)
        if q.returncode != 0:
            return f"the htb qdisc is not available: {q.stderr.strip()}"
        v = _run(["ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0"], check=False)
        if v.returncode != 0:
            return f"veth links cannot be created: {v.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None
