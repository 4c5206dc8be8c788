"""Run math-verify in child processes that are killed when an answer takes too long.

math-verify hands answers to sympy, which can run for ever on a short answer (``\\boxed{9^{9^{9^{9}}}}`` makes it
compute a power tower as a Python integer, holding the GIL). math-verify's own timeout uses ``SIGALRM``: it
raises outside the main thread (the env server calls envs from gRPC worker threads), replaces the process's alarm
handler, and cannot interrupt C code anyway. So math-verify runs here, in ``python -m marti.rewards.math_worker``
processes (JSON lines over stdin/stdout, started on first use, at most :data:`MAX_WORKERS` at a time, reused),
with its own timeouts off; a call that does not answer within ``timeout_s`` kills its process and the answer
counts as wrong (a warning names it). A worker exits when its parent closes its stdin (the parent's exit).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
from typing import Any

from marti.errors import InternalError

_LOG = logging.getLogger(__name__)

#: Most math-verify worker processes alive at once (callers beyond it wait for a free one).
MAX_WORKERS = 4
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

    def ask(self, label: str, answer: str, timeout_s: float) -> bool | None:
        """Send one question; raises ``TimeoutError`` past ``timeout_s`` and ``EOFError`` if the process died."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps([label, answer]) + "\n")
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
    with _slots:
        for _attempt in range(2):
            worker = _take()
            try:
                result = worker.ask(label, answer, timeout_s)
            except TimeoutError:
                _drop(worker)
                _LOG.warning(
                    "math verifier: math-verify took over math_timeout_s=%s on answer %.200r (label %.80r): "
                    "scored wrong and its worker process restarted",
                    timeout_s,
                    answer,
                    label,
                )
                return False
            except EOFError:
                _drop(worker)
                continue
            _idle.put(worker)
            return result
    raise InternalError(f"the math-verify worker process died twice on answer {answer[:200]!r}")


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
    """Worker loop: read ``[label, answer]`` JSON lines, write ``true``/``false``/``null`` lines."""
    logging.disable(
        logging.WARNING
    )  # math-verify's "timeout is disabled" notice: the parent kills slow calls
    import math_verify

    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        label, answer = json.loads(line)
        try:
            result = _answer(math_verify, label, answer)
        except Exception:  # noqa: BLE001 - an answer math-verify fails on is not equal to the label
            result = False
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
