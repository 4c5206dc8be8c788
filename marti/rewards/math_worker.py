"""Run math-verify, and the ``regex`` verifier's pattern, in child processes that are killed when an answer takes
too long.

math-verify hands answers to sympy, which can run for ever on a short answer (``\\boxed{9^{9^{9^{9}}}}`` makes it
compute a power tower as a Python integer, holding the GIL). math-verify's own timeout uses ``SIGALRM``: it
raises outside the main thread (the env server calls envs from gRPC worker threads), replaces the process's alarm
handler, and cannot interrupt C code anyway. So math-verify runs here, in ``python -m marti.rewards.math_worker``
processes (JSON lines over stdin/stdout, started on first use, at most :data:`MAX_WORKERS` at a time, reused),
with its own timeouts off; a call that does not answer within ``timeout_s`` kills its process and the answer
counts as wrong (a warning names it). A worker exits when its parent closes its stdin (the parent's exit).

The ``regex`` verifier's pattern runs in the same workers (:func:`last_match_in_worker`): Python's ``re`` has no
time limit and holds the GIL, and a pattern such as ``(a+)+$`` backtracks for minutes on a 31-character reply
(``"a" * 30 + "!"``: 73 s), so a match that takes over its timeout kills its worker and counts as no match.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
from typing import Any

from marti.errors import InternalError

_LOG = logging.getLogger(__name__)

#: Most math-verify worker processes alive at once (callers beyond it wait for a free one).
MAX_WORKERS = 4
#: Longest time a ``regex`` verifier's match (:func:`last_match_in_worker`) may take on one reply, seconds.
REGEX_TIMEOUT_S = 1.0
#: Longest wait for a new worker to import math-verify, seconds.
START_TIMEOUT_S = 120.0


class _Worker:
    """One ``python -m marti.rewards.math_worker`` process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "marti.rewards.math_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
        )
        try:
            started = self._read(START_TIMEOUT_S) == "ready"
        except (TimeoutError, EOFError, ValueError):
            started = False
        if not started:
            self.kill()
            raise InternalError("the math-verify worker process did not start (is math-verify installed?)")

    def _read(self, timeout_s: float) -> Any:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            raise TimeoutError
        line = out.readline()
        if not line:
            raise EOFError
        return json.loads(line)

    def ask(self, request: list[str], timeout_s: float) -> Any:
        """Send one question (``["math", label, answer]`` or ``["regex", pattern, text]``); raises
        ``TimeoutError`` past ``timeout_s`` and ``EOFError`` if the process died."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EOFError from None
        return self._read(timeout_s)

    def kill(self) -> None:
        """Kill the process and reap it."""
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


_idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
_slots = threading.BoundedSemaphore(MAX_WORKERS)
_alive: set[_Worker] = set()
_alive_lock = threading.Lock()


def _take() -> _Worker:
    try:
        return _idle.get_nowait()
    except queue.Empty:
        worker = _Worker()
        with _alive_lock:
            _alive.add(worker)
        return worker


def _drop(worker: _Worker) -> None:
    with _alive_lock:
        _alive.discard(worker)
    worker.kill()


def _forget_in_child() -> None:
    """After a fork, the child starts its own workers: the inherited ones (and their pipes) are the parent's."""
    global _idle, _slots, _alive_lock
    _idle = queue.LifoQueue()
    _slots = threading.BoundedSemaphore(MAX_WORKERS)
    _alive_lock = threading.Lock()
    _alive.clear()


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _kill_all() -> None:
    with _alive_lock:
        workers = list(_alive)
        _alive.clear()
    for worker in workers:
        worker.kill()


def verify_in_worker(label: str, answer: str, timeout_s: float) -> bool | None:
    """Ask a worker process whether math-verify finds ``answer`` equal to ``label``.

    Args:
        label: The reference answer (LaTeX or plain).
        answer: The reply's answer text.
        timeout_s: Longest time math-verify may take, seconds; past it the worker is killed and the answer
            counts as wrong.

    Returns:
        True or False; ``None`` when math-verify cannot parse ``label`` (the caller compares it as text).

    Raises:
        InternalError: A worker could not start or died twice on this question.
    """
    try:
        return _ask(["math", label, answer], timeout_s)
    except TimeoutError:
        _LOG.warning(
            "math verifier: math-verify took over math_timeout_s=%s on answer %.200r (label %.80r): "
            "scored wrong and its worker process restarted",
            timeout_s,
            answer,
            label,
        )
        return False


def last_match_in_worker(pattern: str, text: str, timeout_s: float = REGEX_TIMEOUT_S) -> str | None:
    """:func:`last_match` of ``pattern`` in ``text``, run in a worker process that is killed past ``timeout_s``
    seconds (then a warning names the pattern and the text, and there is no match).

    Returns:
        The match's text, or None: no match, its group 1 did not take part, or none found within ``timeout_s``.

    Raises:
        InternalError: A worker could not start or died twice on this question.
    """
    try:
        return _ask(["regex", pattern, text], timeout_s)
    except TimeoutError:
        _LOG.warning(
            "regex verifier: pattern %r took over %s s on reply %.200r: no match (scored wrong) and its worker "
            "process restarted",
            pattern,
            timeout_s,
            text,
        )
        return None


def _ask(request: list[str], timeout_s: float) -> Any:
    """A worker's answer to ``request`` (a process that dies is replaced once).

    Raises:
        TimeoutError: No answer within ``timeout_s`` seconds (the worker is killed).
        InternalError: A worker could not start or died twice on this question.
    """
    with _slots:
        for _attempt in range(2):
            worker = _take()
            try:
                result = worker.ask(request, timeout_s)
            except TimeoutError:
                _drop(worker)
                raise
            except EOFError:
                _drop(worker)
                continue
            _idle.put(worker)
            return result
    raise InternalError(f"the verifier worker process died twice on {request[0]} input {request[2][:200]!r}")


def last_match(pattern: str, text: str) -> str | None:
    """The text of ``pattern``'s LAST match in ``text`` (Python ``re``): its group 1 when the pattern has a group
    (None when that group did not take part), else the whole match; None when there is no match."""
    compiled = re.compile(pattern)
    matches = list(compiled.finditer(text))
    if not matches:
        return None
    return matches[-1].group(1) if compiled.groups else matches[-1].group(0)


def _parse(math_verify: Any, text: str) -> list[Any]:
    """math-verify's parse of ``text``, first as inline LaTeX when it has no math delimiters."""
    if not any(mark in text for mark in ("$", "\\(", "\\[", "\\boxed")):
        parsed = math_verify.parse(f"${text}$", parsing_timeout=None)
        if parsed:
            return parsed
    return math_verify.parse(text, parsing_timeout=None)


def _answer(math_verify: Any, label: str, answer: str) -> bool | None:
    gold = _parse(math_verify, label)
    if not gold:
        return None
    pred = _parse(math_verify, answer)
    return bool(pred) and bool(math_verify.verify(gold, pred, timeout_seconds=None))


def main() -> None:
    """Worker loop: read ``["math", label, answer]`` lines (write ``true``/``false``/``null``) and
    ``["regex", pattern, text]`` lines (write :func:`last_match`'s text or ``null``), as JSON. math-verify is
    imported first, when it is installed (the parent refuses the math verifier without it)."""
    logging.disable(
        logging.WARNING
    )  # math-verify's "timeout is disabled" notice: the parent kills slow calls
    try:
        import math_verify
    except ImportError:
        math_verify = None

    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        kind, first, second = json.loads(line)
        if kind == "regex":
            print(json.dumps(last_match(first, second)), flush=True)
            continue
        try:
            result = _answer(math_verify, first, second)
        except Exception:  # noqa: BLE001 - an answer math-verify fails on is not equal to the label
            result = False
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
