"""The caller's SIGINT/SIGTERM handlers through ``ray.init``: :func:`callers_signal_handlers`.

``ray.init`` sets a SIGTERM handler of its own as it begins (``sys.exit(15)``, Ray 2.60) and holds it until it
returns, 2-5 s on 2 cores and longer on a busy machine.
``marti train``'s handler (stop after the current step, checkpoint, report; docs/config.md) was replaced for that
window: a SIGTERM then (``timeout``, a scheduler's stop) ended the job at once, exit 15, with no line, no report,
and Ray's agents left running. A SIGINT there already stopped the job cleanly (Ray sets no SIGINT handler).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

_LOG = logging.getLogger("marti.trainer")


def python_signal_handlers() -> dict[int, Any]:
    """The Python-level SIGINT/SIGTERM handlers (only in the main thread, where they can be set; else ``{}``)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore_signal_handlers(saved: dict[int, Any]) -> None:
    """Set the handlers of :func:`python_signal_handlers` again (a ``None``, one not set from Python, is left)."""
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


@contextlib.contextmanager
def callers_signal_handlers() -> Iterator[None]:
    """While open, Ray cannot replace a SIGTERM handler the caller set from Python (``ray.init``'s go through
    ``ray._private.utils.set_sigterm_handler``, which is made to keep the caller's); on exit the caller's SIGINT
    and SIGTERM handlers are set again, whatever ``ray.init`` did to them.

    Off the main thread, or where the SIGTERM handler is the default or ignored, Ray's handlers apply as Ray sets
    them (a process that did not choose a SIGTERM handler gets Ray's clean exit). A Ray without
    ``set_sigterm_handler`` keeps its own during ``ray.init`` (logged as a warning).
    """
    saved = python_signal_handlers()
    ours = saved.get(signal.SIGTERM)
    if not callable(ours):
        try:
            yield
        finally:
            restore_signal_handlers(saved)
        return
    from ray._private import utils

    original = getattr(utils, "set_sigterm_handler", None)
    if original is None:
        _LOG.warning("this Ray has no set_sigterm_handler: a SIGTERM during ray.init ends the job at once")
    else:
        utils.set_sigterm_handler = _keep_callers_handler
    try:
        yield
    finally:
        if original is not None:
            utils.set_sigterm_handler = original
        restore_signal_handlers(saved)


def _keep_callers_handler(handler: Any) -> None:
    """Ray's ``set_sigterm_handler`` while :func:`callers_signal_handlers` is open: the caller's stays."""
    _LOG.debug("ray.init's SIGTERM handler %r not set: the caller's handles SIGTERM", handler)
