"""Graceful shutdown: on SIGTERM every answer being written in this process is
stopped, saved as "incomplete" with the error code ``server_shutdown``, and its client gets an
``error`` event it can retry on, before the server's own shutdown goes on.

How: ``transport.turn_events`` registers the task that runs each turn (``running_turn``). The
first turn run on the main thread installs ``_on_signal`` (``install``), chained to whatever
handler the server installed (uvicorn, daphne/Twisted, gunicorn's worker): by then the server
has installed its own. Under WSGI the turns run on a background thread, so ``AppConfig.ready``
installs it too (gunicorn installs its worker's handlers before loading the application).

The handler cancels every registered turn with ``SHUTDOWN`` as the message; the transports tell
that cancellation from a client's cancel by ``stopping()``. A thread waits (at most
``SHUTDOWN_GRACE_SECONDS``) for those turns to end, then calls the server's handler, which
closes the connections. New turns are refused meanwhile (``server_shutdown``, 503).

**The shutdown is bounded.** A server waits for every connection's task to end (uvicorn:
"Waiting for background tasks to complete", with no limit by default), and a websocket's task
ends only once its consumer has left the channel layer; a layer that does not answer (Redis
stalled, a socket stuck in a read) would hold the process forever, and a deploy would need
SIGKILL, which loses the answers' last text. So ``SHUTDOWN_GRACE_SECONDS`` after the signal a
watchdog thread (``_bound``) cancels every chat connection still open (``open_connection``
registers them), asks the server again (its second signal: uvicorn then stops waiting), and
one second later logs the stack of every task still running and ends the process (status
143, "terminated by SIGTERM") whatever is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time

from django_ragchat.conf import ragchat_settings

logger = logging.getLogger(__name__)

SHUTDOWN = "ragchat-server-shutdown"
# SIGTERM only: Ctrl-C (SIGINT) in a management command keeps its own meaning (stop, "cancelled").
SIGNALS = (signal.SIGTERM,)

SERVER_SHUTDOWN_ERROR = {
    "code": "server_shutdown",
    "message": "The server is restarting; the answer was saved as far as it got. Send your message again.",
}
CANCELLED_ERROR = {"code": "cancelled", "message": "The answer was stopped."}

_turns: dict[asyncio.Task, asyncio.AbstractEventLoop] = {}
# The tasks serving chat connections (websockets): cancelled when the shutdown runs out of time.
_connections: dict[asyncio.Task, asyncio.AbstractEventLoop] = {}
_lock = threading.Lock()
_stopping = threading.Event()
_installed: set[int] = set()


def stopping() -> bool:
    """Whether this process received SIGTERM and is stopping its answers."""
    return _stopping.is_set()


def stopped_error() -> dict[str, str]:
    """The ``error`` saved with an answer stopped early: ``server_shutdown`` while the process
    shuts down, ``cancelled`` otherwise (a cancel, a client gone)."""
    return dict(SERVER_SHUTDOWN_ERROR if stopping() else CANCELLED_ERROR)


@contextlib.contextmanager
def _registered(registry: dict):
    """The current task in ``registry`` (with its loop) for the duration of the block."""
    task = asyncio.current_task()
    install()  # the server has installed its handlers by now: chain to them
    with _lock:
        registry[task] = asyncio.get_running_loop()
    try:
        yield
    finally:
        with _lock:
            registry.pop(task, None)


def running_turn():
    """Register the current task as running a turn, for the duration of the block."""
    return _registered(_turns)


def open_connection():
    """Register the current task as serving a chat connection, for the duration of the block:
    if the process is still stopping ``SHUTDOWN_GRACE_SECONDS`` after SIGTERM, it is cancelled."""
    return _registered(_connections)


def install() -> None:
    """Install the signal handler, chained to the current one; from the main thread only (a
    no-op elsewhere), once per handler in place."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        try:
            current = signal.getsignal(sig)
            if id(current) in _installed or current is signal.SIG_IGN:
                continue
            handler = _handler(current)
            signal.signal(sig, handler)
            _installed.add(id(handler))
        except (ValueError, OSError):  # not the main interpreter, or an unsupported platform
            return


def _handler(previous):
    def on_signal(signum, frame):
        _on_signal(previous, signum, frame)

    return on_signal


def _on_signal(previous, signum, frame) -> None:
    if _stopping.is_set():  # a second signal: no more waiting
        _chain(previous, signum, frame)
        return
    _stopping.set()
    deadline = time.monotonic() + ragchat_settings.SHUTDOWN_GRACE_SECONDS
    threading.Thread(target=_bound, args=(previous, signum, deadline), name="ragchat-shutdown-bound",
                     daemon=True).start()
    with _lock:
        turns = list(_turns.items())
    for task, loop in turns:
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(task.cancel, SHUTDOWN)
    if not turns:
        _chain(previous, signum, frame)
        return
    logger.warning("ragchat: stopping %d answer(s) being written before shutting down", len(turns))
    threading.Thread(target=_wait_then_chain, args=(previous, signum, [t for t, _ in turns], deadline),
                     name="ragchat-shutdown", daemon=True).start()


def _wait_then_chain(previous, signum, tasks, deadline: float) -> None:
    while time.monotonic() < deadline and any(not task.done() for task in tasks):
        time.sleep(0.02)
    # The final events are written to the sockets' buffers; let the loop flush them.
    time.sleep(0.1)
    _chain(previous, signum, None)


def _bound(previous, signum, deadline: float) -> None:
    """The watchdog: the process ends at most about one second after ``deadline``."""
    time.sleep(max(0.0, deadline - time.monotonic()))
    with _lock:
        left = list(_connections.items())
    if left:
        logger.warning("ragchat: %d connection(s) still open %s s after SIGTERM: closing them",
                       len(left), ragchat_settings.SHUTDOWN_GRACE_SECONDS)
    for task, loop in left:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(task.cancel, SHUTDOWN)
    time.sleep(0.5)
    _chain(previous, signum, None)  # the server's second signal: stop waiting (uvicorn's force exit)
    time.sleep(1.0)
    logger.error("ragchat: the process did not stop within SHUTDOWN_GRACE_SECONDS (%s s) of SIGTERM; "
                 "ending it. Still running:\n%s", ragchat_settings.SHUTDOWN_GRACE_SECONDS, _running_tasks())
    logging.shutdown()
    os._exit(128 + signum)


def _running_tasks() -> str:
    """The stack of every task still running on the loops this module knows, for the log."""
    loops = {loop for loop in [*_turns.values(), *_connections.values()]}
    lines = []
    for loop in loops:
        with contextlib.suppress(RuntimeError):
            for task in asyncio.all_tasks(loop):
                stack = task.get_stack(limit=8)
                where = " <- ".join(f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}"
                                    for f in reversed(stack))
                lines.append(f"  {task.get_name()}: {where or task.get_coro()}")
    return "\n".join(lines) or "  (no task of a known loop)"


def _chain(previous, signum, frame) -> None:
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
