"""``python -m marti`` runs the ``marti`` command, as the console script does."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marti", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_python_m_marti_prints_the_version_and_usage() -> None:
    from marti import __version__

    version = _run("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"marti-agent {__version__}"
    usage = _run()
    assert usage.returncode == 0 and "marti COMMAND --help" in usage.stdout


def test_python_m_marti_refuses_an_unknown_command_with_exit_2() -> None:
    out = _run("no-such-command")
    assert out.returncode == 2
    assert "unknown command 'no-such-command'" in out.stderr
