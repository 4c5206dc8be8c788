"""No code path in marti/ or services/ unpickles, evals or execs data: a grep over the source tree.

Data from the network is protobuf, JSON (orjson), UTF-8 text or raw tensors; configs are parsed with
``yaml.safe_load``; checkpoints are loaded with ``torch.load(..., weights_only=True)``. A new use of any
of the patterns below fails this test; a reviewed exception must be added to ``ALLOWED`` with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("marti", "services")
#: Generated protobuf code is not hand-written; it only calls the protobuf runtime.
SKIPPED_PARTS = ("api",)

PATTERNS = {
    "pickle": re.compile(r"\b(c?pickle|cloudpickle|dill|shelve|marshal|jsonpickle)\b"),
    "eval": re.compile(r"(?<![\w.])eval\s*\("),
    "exec": re.compile(r"(?<![\w.])exec\s*\("),
    "compile": re.compile(r"(?<![\w.])compile\s*\([^)]*['\"]exec['\"]"),
    "unsafe yaml": re.compile(r"yaml\.(load|load_all|unsafe_load|full_load)\s*\("),
    "torch.load without weights_only=True": re.compile(r"torch\.load\s*\((?!.*weights_only\s*=\s*True)"),
    "numpy allow_pickle": re.compile(r"allow_pickle\s*=\s*True"),
    "pandas read_pickle": re.compile(r"read_pickle\s*\("),
    "os.system / shell=True": re.compile(r"os\.system\s*\(|shell\s*=\s*True"),
}

#: (relative path, pattern name) pairs reviewed as safe, with the reason.
ALLOWED: dict[tuple[str, str], str] = {}


def _sources() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[1] in SKIPPED_PARTS and rel.parts[0] == "marti":
                continue
            files.append(path)
    return files


def find_unsafe(files: list[Path], root: Path = ROOT) -> list[str]:
    """Return ``path:line: pattern: code`` (path relative to ``root``) for every match not in :data:`ALLOWED`."""
    hits = []
    for path in files:
        rel = str(path.relative_to(root))
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if code.lstrip().startswith(('"', "'")):
                continue  # docstring lines mention the words
            for name, pattern in PATTERNS.items():
                if pattern.search(code) and (rel, name) not in ALLOWED:
                    hits.append(f"{rel}:{lineno}: {name}: {line.strip()}")
    return hits


def test_no_pickle_eval_or_exec_of_data_in_the_code():
    files = _sources()
    assert len(files) > 50, "the scan must see the source tree"
    assert find_unsafe(files) == []


def test_the_scan_catches_each_pattern(tmp_path):
    """The patterns are not dead: each catches a representative line (and skips comments)."""
    samples = {
        "pickle": "import pickle",
        "eval": "x = eval(data)",
        "exec": "exec(code)",
        "compile": "compile(src, 'f', 'exec')",
        "unsafe yaml": "yaml.load(text, Loader=yaml.Loader)",
        "torch.load without weights_only=True": "torch.load(path, weights_only=False)",
        "numpy allow_pickle": "np.load(f, allow_pickle=True)",
        "pandas read_pickle": "pd.read_pickle(p)",
        "os.system / shell=True": "subprocess.run(cmd, shell=True)",
    }
    for name, line in samples.items():
        assert PATTERNS[name].search(line), name
    assert not PATTERNS["eval"].search("model.eval()")
    assert not PATTERNS["torch.load without weights_only=True"].search("torch.load(p, weights_only=True)")
    fake = tmp_path / "probe.py"
    fake.write_text("# pickle in a comment is fine\nimport pickle\n")
    assert find_unsafe([fake], tmp_path) == ["probe.py:2: pickle: import pickle"]
