"""The README's and docs' code snippets, run as written.

Every ```python fence of ``README.md`` and ``docs/*.md`` runs in a fresh interpreter (cwd = the repository
root, a timeout each); the snippets that dial ``localhost:5005x`` run against ``marti up --no-trainer`` on its
default ports, started once for this module, exactly as a reader would run them. Every ``marti ...`` command
line in the other fences is checked at ``--help`` level: the subcommand exists and takes each ``--flag`` the
line uses, and each ``*.yaml`` path it names exists.

A snippet that cannot run standalone is marked in the markdown, in an HTML comment on the line right above its
fence (blank lines between are allowed; see docs/CONVENTIONS.md):

- ``<!-- snippet: skip REASON -->``: not run (a running job, a GPU, placeholders); the reason is required.
- ``<!-- snippet: given CODE -->``: ``CODE`` (one line) runs before the snippet, for a placeholder the
  reader supplies (``my_llm``).

An unmarked snippet that fails fails this test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Seconds one python snippet may run: a guard against a hang, not an expected duration (each snippet takes a few
#: seconds; the README's store snippet samples batch_size=1 from the one item it shared, so it does not wait).
SNIPPET_TIMEOUT_S = 60.0
_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)
_MARKER = re.compile(r"<!--\s*snippet:\s*(?P<kind>\w+)\s*(?P<arg>.*?)\s*-->\s*$")
_STACK_ADDRESS = re.compile(r"localhost:5005[0-4]")


@dataclass(frozen=True)
class Snippet:
    """One fenced block: where it is, its language, its code and its marker (``kind``/``arg``, or ``""``)."""

    path: Path
    line: int
    lang: str
    code: str
    kind: str = ""
    arg: str = ""

    @property
    def name(self) -> str:
        """``FILE:LINE`` of the opening fence."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _marker_above(text: str, start: int) -> tuple[str, str]:
    """The snippet marker on the last non-blank line before offset ``start``, or ``("", "")``."""
    for line in reversed(text[:start].splitlines()):
        if line.strip():
            match = _MARKER.search(line)
            return (match["kind"], match["arg"]) if match else ("", "")
    return "", ""


def snippets(paths: list[Path] = DOCS) -> list[Snippet]:
    """Every fenced block of ``paths``, in order."""
    out = []
    for path in paths:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            kind, arg = _marker_above(text, m.start())
            line = text.count("\n", 0, m.start()) + 1
            out.append(Snippet(path, line, m["lang"], m["body"], kind, arg))
    return out


PYTHON = [s for s in snippets() if s.lang in ("python", "py")]


def _clean_env() -> dict[str, str]:
    """The caller's environment without ``MARTI_*`` variables (a token or address there would change runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARTI_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.fixture(scope="module")
def marti_up() -> Iterator[None]:
    """``marti up --no-trainer`` on its default ports 50051-50053, as the README starts it; stopped at the end."""
    marti = shutil.which("marti", path=str(Path(sys.executable).parent)) or "marti"
    proc = subprocess.Popen(
        [marti, "up", "--no-trainer"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_clean_env(),
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 90
    try:
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if not line or "all services SERVING" in line:
                break
        if not lines[-1] or "all services SERVING" not in lines[-1]:
            pytest.fail(
                "`marti up --no-trainer` did not come up on ports 50051-50053 (the snippets' addresses; "
                "is another stack using them?):\n" + "".join(lines)[-3000:]
            )
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    # SIGTERM to `marti up` stops every service it started, each cleanly, and exits 0 (docs/operations.md)
    rest = proc.stdout.read()
    assert code == 0 and "stopped: store=0, env-server=0, broker=0" in rest, (code, rest[-3000:])


@pytest.mark.parametrize("snippet", PYTHON, ids=[s.name for s in PYTHON])
def test_python_snippet_runs(snippet: Snippet, request: pytest.FixtureRequest) -> None:
    """Each python snippet, not marked skip, exits 0 in a fresh interpreter (against ``marti up`` if it dials it)."""
    if snippet.kind == "skip":
        pytest.skip(f"marked in the markdown: {snippet.arg}")
    if _STACK_ADDRESS.search(snippet.code):
        request.getfixturevalue("marti_up")
    code = (snippet.arg + "\n" if snippet.kind == "given" else "") + snippet.code
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=SNIPPET_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{snippet.name} ran past {SNIPPET_TIMEOUT_S:.0f} s:\n{code}")
    assert out.returncode == 0, (
        f"{snippet.name} failed (exit {out.returncode}):\n{code}\n{out.stderr[-3000:]}"
    )


def test_every_marker_is_known_and_explained() -> None:
    """Markers are ``skip REASON`` or ``given CODE`` with a non-empty argument, and sit above a fence."""
    for snippet in snippets():
        if snippet.kind:
            assert snippet.kind in ("skip", "given") and snippet.arg, f"{snippet.name}: bad snippet marker"
    for path in DOCS:
        text = path.read_text()
        markers = len([line for line in text.splitlines() if _MARKER.search(line)])
        marked = len([s for s in snippets([path]) if s.kind])
        assert markers == marked, f"{path.name}: a snippet marker that is not right above a fence"


def marti_commands(blocks: list[Snippet]) -> list[tuple[str, list[str]]]:
    """``(snippet name, argv after "marti")`` of each ``marti ...`` command line of the non-python fences;
    ``\\``-continued lines are joined, comments dropped, and ``a|b`` subcommand alternatives expanded."""
    out = []
    for snippet in blocks:
        if snippet.lang in ("python", "py"):
            continue
        for line in snippet.code.replace("\\\n", " ").splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) < 2 or words[0] != "marti":
                continue
            for sub in words[1].split("|"):
                out.append((snippet.name, [sub, *words[2:]]))
    return out


COMMANDS = marti_commands(snippets())


def _help(argv: tuple[str, ...]) -> str:
    """The output of ``marti ARGV --help`` (exit 0 asserted)."""
    out = subprocess.run(
        [sys.executable, "-m", "marti.command.main", *argv, "--help"],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"marti {' '.join(argv)} --help failed:\n{out.stdout}{out.stderr}"
    return out.stdout


def test_marti_commands_exist_with_their_flags() -> None:
    """Each documented ``marti`` command's subcommand exists and takes every flag the line uses."""
    assert len(COMMANDS) >= 10, COMMANDS
    helps: dict[tuple[str, ...], str] = {}
    for name, argv in COMMANDS:
        sub = tuple(argv[:2]) if argv[0] == "bench" else (argv[0],)
        if sub not in helps:
            helps[sub] = _help(sub)
        for word in argv[len(sub) :]:
            flag = re.match(r"\[?(--[A-Za-z][\w-]*)", word)
            if flag:
                assert re.search(rf"{flag[1]}\b", helps[sub]), (
                    f"{name}: `marti {' '.join(sub)}` has no {flag[1]}"
                )
            elif word.startswith("examples/"):
                assert (ROOT / word).is_file(), f"{name}: {word} does not exist"
