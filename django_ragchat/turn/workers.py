"""Who holds a lease: the identity of the worker process writing an answer, and whether the
worker a lease names is known to be dead.

Every lease (a streaming answer's ``Message.lease_holder``, a stream slot's cache value) names
the process that renews it: ``<machine>/<pid>/<start>``, where ``machine`` is the kernel's boot
id and the process's PID namespace, and ``start`` the process's start time in clock ticks since
boot (``/proc/<pid>/stat``). A PID alone could be reused by a later process; PID and start time
together name one process for the life of the machine.

A lease whose holder is on this machine (same boot, same PID namespace) and whose process no
longer runs belongs to a dead worker: it is closed at once, whatever time its lease still has.
This is what lets a conversation take its next message right after ``kill -9`` and a restart
(gunicorn's master respawning a worker, systemd restarting uvicorn), instead of at the end of
``STREAM_LEASE_SECONDS``. A holder on another machine cannot be checked this way: its lease
stands until it expires, as before.

The rule never takes a live worker for a dead one: a holder whose process cannot be looked at
(another machine, another PID namespace, a platform without ``/proc``) counts as alive.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from pathlib import Path

PROC = Path("/proc")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@functools.cache
def machine() -> str:
    """This machine's and PID namespace's id ("" where it cannot be known: no ``/proc``)."""
    boot = _read(PROC / "sys" / "kernel" / "random" / "boot_id")
    try:
        namespace = os.readlink(PROC / "self" / "ns" / "pid")
    except OSError:
        namespace = ""
    if not boot or not namespace:
        return ""
    return f"{boot.replace('-', '')[:16]}{namespace.removeprefix('pid:').strip('[]')}"


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, as text), "" when it runs but
    cannot be read, ``None`` when no such process exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # it runs, as another user
        pass
    stat = _read(PROC / str(pid) / "stat")
    # The command name (field 2) is in parentheses and may hold spaces: count after the last one.
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


@functools.cache
def _identity(pid: int) -> str:
    here = machine()
    if not here:
        # No way for others to check this process: a name that never matches a machine.
        return f"host:{socket.gethostname()[:40]}/{pid}/"
    return f"{here}/{pid}/{process_start(pid) or ''}"


def identity() -> str:
    """This process's name in the leases it holds (recomputed after a fork: a worker forked from
    a master that loaded the application has a PID of its own)."""
    return _identity(os.getpid())


def is_dead(holder: str) -> bool:
    """Whether the process named by ``holder`` (an ``identity()``) is known to have stopped:
    on this machine, and no process runs with its PID and start time. ``False`` when unknown."""
    here = machine()
    if not holder or not here:
        return False
    place, _, rest = holder.partition("/")
    pid_text, _, start = rest.partition("/")
    if place != here or not start:
        return False
    with contextlib.suppress(ValueError):
        pid = int(pid_text)
        if pid == os.getpid():
            return holder != identity()
        running = process_start(pid)
        return running is None or (running != "" and running != start)
    return False


def on_this_machine(holder: str) -> bool:
    """Whether ``is_dead`` can tell about ``holder`` (it names a process of this machine)."""
    here = machine()
    return bool(here) and holder.startswith(here + "/")
