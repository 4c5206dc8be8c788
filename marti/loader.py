"""The one loader of ``"module:attr"`` import paths, for the SDK and the services alike.

Every place that turns a string into an object goes through :func:`load_attr`: the env registry's providers
(``marti.env_registry``), user workflows, rewards and envs named by import path (``marti.workflow``), and the env
server's ``entry_point`` config of the PettingZoo/Gymnasium adapters, which passes its allow-list of module
prefixes as ``allowed``. Malformed, refused and missing paths all raise :mod:`marti.errors` classes naming the
path.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from marti.errors import InvalidArgumentError, NotFoundError

__all__ = ["load_attr"]


def load_attr(
    path: Any,
    *,
    allowed: Sequence[str] | None = None,
    files: bool = False,
    what: str = "import path",
    form: str = "'module:attr'",
) -> Any:
    """Import the object an import path names.

    Args:
        path: ``"package.module:attr"`` (``attr`` may be dotted, ``Class.method``); with ``files``, also
            ``"path/to/file.py:attr"`` (relative to the working directory, or absolute).
        allowed: Module prefixes the path's module must start with (``None``: any module). A ``.py`` file is
            never allowed when a list is given.
        files: Accept ``file.py:attr`` paths, and put the working directory on ``sys.path`` so that modules
            next to the caller's config import.
        what: How errors name the path (``"entry_point"``, ``"env provider"``).
        form: The expected shape, as errors show it (``"'module:factory'"``).

    Returns:
        The object (not checked further: callers check that it is callable when they need one).

    Raises:
        InvalidArgumentError: ``path`` is not a string of the form ``module:attr``, or its module is not under
            one of ``allowed`` (the prefixes named).
        NotFoundError: The module, file or attribute does not exist (named).
    """
    module_name, attr = _split(path, what, form)
    if allowed is not None and (module_name.endswith(".py") or not module_name.startswith(tuple(allowed))):
        raise InvalidArgumentError(
            f"{what} module {module_name!r} is not allowed (allowed prefixes: {', '.join(allowed)})"
        )
    if files and module_name.endswith(".py"):
        module = _load_file(path, module_name)
    else:
        module = _import(path, module_name, what, files)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise NotFoundError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _split(path: Any, what: str, form: str) -> tuple[str, str]:
    """``(module, attr)`` of ``path``, or the :class:`InvalidArgumentError` of a malformed one."""
    if isinstance(path, str):
        module_name, sep, attr = path.rpartition(":")
        if sep and module_name and attr:
            return module_name, attr
    raise InvalidArgumentError(f"{what} must look like {form}, got {path!r}")


def _import(path: str, module_name: str, what: str, cwd_on_path: bool) -> ModuleType:
    """Import a module by name (ImportError -> :class:`NotFoundError` naming the path)."""
    if cwd_on_path:
        cwd = str(Path.cwd())
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise NotFoundError(
            f"{what} {path!r}: cannot import module {module_name!r}: not found or not importable ({e})"
        ) from None


def _load_file(path: str, file_name: str) -> ModuleType:
    """Load ``file_name`` (a ``.py`` file) as a module, once per process (kept in ``sys.modules``)."""
    file = Path(file_name).resolve()
    if not file.is_file():
        raise NotFoundError(f"import path {path!r}: file {str(file)!r} does not exist")
    name = "marti_user_" + "_".join(file.with_suffix("").parts[-3:]).replace("-", "_").replace(".", "_")
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise NotFoundError(f"import path {path!r}: cannot load {str(file)!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module
