"""The one loader of ``"module:attr"`` import paths, for the SDK and the services alike.

Every place that turns a string into an object goes through :func:`load_attr`: the env registry's providers
(``marti.env.registry``), user workflows, rewards and envs named by import path (``marti.team.workflow``), and the env
server's ``entry_point`` config of the PettingZoo/Gymnasium adapters, which passes its allow-list of module
prefixes as ``allowed``. Malformed, refused and missing paths, and modules or files that exist but fail to run
(a syntax error, a failed import inside them), all raise :mod:`marti.errors` classes naming the path.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
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
            one of ``allowed`` (the prefixes named, quoted: ``entry_point module 'gymnasium' is not allowed: its
            name must start with one of 'pettingzoo.', 'gymnasium.' ('gymnasium' itself does not; ...)``).
        NotFoundError: The module, file or attribute does not exist (named).
        InvalidArgumentError: The module or file exists but running it failed (a ``SyntaxError``, a failed import
            inside it, any exception its top level raised): the message names the path, the file and line, and
            the exception, which is chained.
    """
    module_name, attr = _split(path, what, form)
    if allowed is not None and (module_name.endswith(".py") or not module_name.startswith(tuple(allowed))):
        raise InvalidArgumentError(_not_allowed(what, module_name, allowed))
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


def _not_allowed(what: str, module_name: str, allowed: Sequence[str]) -> str:
    """The refusal of ``module_name``: the prefixes quoted, and a hint when it is an allowed prefix's package."""
    prefixes = ", ".join(repr(prefix) for prefix in allowed)
    msg = f"{what} module {module_name!r} is not allowed: its name must start with one of {prefixes}"
    if f"{module_name}." in allowed:
        msg += f" ({module_name!r} itself does not; name a module inside it, '{module_name}.<module>')"
    return msg


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
    except ModuleNotFoundError as e:
        if e.name is None or not _is_prefix(e.name, module_name):
            raise _failed_to_run(
                what, path, f"module {module_name!r}", e
            ) from e  # an import inside it failed
        raise NotFoundError(
            f"{what} {path!r}: cannot import module {module_name!r}: not found or not importable ({e})"
        ) from None
    except Exception as e:  # the module exists; its code failed (SyntaxError, ImportError of a name, ...)
        raise _failed_to_run(what, path, f"module {module_name!r}", e) from e


def _is_prefix(missing: str, module_name: str) -> bool:
    """Whether ``missing`` (a ``ModuleNotFoundError.name``) is ``module_name`` or one of its parent packages:
    the path itself does not exist, as opposed to a module that exists and imports a missing one."""
    return module_name == missing or module_name.startswith(missing + ".")


def _failed_to_run(what: str, path: str, which: str, exc: BaseException) -> InvalidArgumentError:
    """The :class:`InvalidArgumentError` of a module that exists but raised while it was run: names the path,
    the module or file, the exception and the file and line where it was raised (a ``SyntaxError``'s own fields,
    else the innermost frame of its traceback outside importlib)."""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" at {exc.filename}:{exc.lineno}"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
        if frames:
            where = f" at {frames[-1].filename}:{frames[-1].lineno}"
    return InvalidArgumentError(
        f"{what} {path!r}: {which} exists but failed to load{where}: {type(exc).__name__}: {exc}"
    )


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
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # SyntaxError, a failed import inside it, any error of its top level
            del sys.modules[name]  # so that a fixed file loads next time
            raise _failed_to_run("import path", path, f"file {str(file)!r}", e) from e
    return module
