"""The test processes keep the compiled, assert-rewritten test modules in ``__pycache__`` even where the shell sets
``PYTHONDONTWRITEBYTECODE`` (``tests/conftest.py``), so a later run in the same tree does not rewrite them again."""

from __future__ import annotations

import sys
from pathlib import Path

from _pytest.assertion.rewrite import PYTEST_TAG, get_cache_dir


def test_this_module_was_cached_when_it_was_collected():
    assert sys.dont_write_bytecode is False
    here = Path(__file__)
    cached = get_cache_dir(here) / f"{here.stem}.{PYTEST_TAG}.pyc"
    assert cached.is_file(), f"{cached} was not written"
