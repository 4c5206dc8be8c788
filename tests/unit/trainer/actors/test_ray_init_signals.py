"""``callers_signal_handlers``: a SIGTERM that lands while ``ray.init`` runs reaches the caller's handler (``marti
train``'s stop after the current step) instead of Ray's, which exits at once; outside the context Ray's functions
are its own again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[4]

# SIGTERM is sent from inside ray.init, as its head processes start: Ray's handler is set by then.
PROGRAM = textwrap.dedent(
    """
    import os, signal
    import ray
    from ray._private import node
    from services.trainer.ray.init_signals import callers_signal_handlers

    got = []
    def handler(signum, frame):
        got.append(signum)
    signal.signal(signal.SIGTERM, handler)

    start_head = node.Node.start_head_processes
    def start_head_then_sigterm(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return start_head(self)
    node.Node.start_head_processes = start_head_then_sigterm

    with callers_signal_handlers():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    print("initialized", ray.is_initialized(), "got", got, "ours", signal.getsignal(signal.SIGTERM) is handler)
    ray.shutdown()
    """
)


def test_a_sigterm_during_ray_init_reaches_the_callers_handler(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert f"initialized True got [{int(signal.SIGTERM)}] ours True" in proc.stdout, proc.stdout


def test_rays_function_is_back_after_the_context_and_untouched_without_a_python_handler():
    from ray._private import utils

    from services.trainer.ray.init_signals import callers_signal_handlers

    original = utils.set_sigterm_handler
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, lambda *_: None)
        with pytest.raises(RuntimeError, match="init failed"), callers_signal_handlers():
            assert utils.set_sigterm_handler is not original
            raise RuntimeError("init failed")
        assert utils.set_sigterm_handler is original
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with callers_signal_handlers():
            assert utils.set_sigterm_handler is original  # Ray's handler applies: the caller chose none
    finally:
        signal.signal(signal.SIGTERM, before)


def test_off_the_main_thread_rays_function_stays_and_a_ray_without_it_is_warned_about(monkeypatch, caplog):
    import threading

    from ray._private import utils

    from services.trainer.ray.init_signals import callers_signal_handlers

    original = utils.set_sigterm_handler
    seen = []

    def in_a_thread() -> None:
        with callers_signal_handlers():
            seen.append(utils.set_sigterm_handler is original)

    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, lambda *_: None)
        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join(10)
        assert seen == [True]  # a thread sets no handler: Ray's applies, as Ray decides for threads
        monkeypatch.delattr(utils, "set_sigterm_handler")
        with caplog.at_level("WARNING", logger="marti.trainer"), callers_signal_handlers():
            pass
        assert "this Ray has no set_sigterm_handler" in caplog.text
    finally:
        signal.signal(signal.SIGTERM, before)
