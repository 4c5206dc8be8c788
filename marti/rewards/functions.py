"""User reward functions, called the way TRL's ``GRPOTrainer`` calls its ``reward_funcs``.

A reward function is named by an import path, ``"path/to/file.py:fn"`` or ``"package.module:fn"`` (the one
loader, :func:`marti.team.workflow.load_callable`), or given as a callable. It is called with keyword arguments only::

    fn(prompts=[...], completions=[...], **columns) -> list[float]

``prompts`` and ``completions`` are lists of B strings, and every dataset column is passed as a keyword of the
same name holding B values (``label=[...]``, ``answer=[...]``), one per completion. As in TRL, the columns named
``prompt`` and ``completion`` are not passed again (they are what ``prompts``/``completions`` hold), so a
function should take ``**kwargs`` for the columns it does not use. Unlike TRL, marti passes text completions
only (no ``completion_ids``, no ``trainer_state``), and a ``None`` score is an error, not "not applicable".

Several functions with weights (TRL's ``reward_weights``): :func:`reward_functions`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from marti.errors import InvalidArgumentError, MartiError
from marti.plumbing.arguments import checked
from marti.rewards.base import WeightedSum, check_batch, check_scores, shorten
from marti.team.workflow import load_callable

__all__ = ["RESERVED_COLUMNS", "RewardFunction", "check_column_names", "reward_functions"]

#: Columns not passed as keywords: what ``prompts`` / ``completions`` already hold (as TRL does).
_NOT_PASSED = ("prompt", "completion")
#: Column names a reward function cannot be passed: they would collide with the call's own keywords.
RESERVED_COLUMNS = ("prompts", "completions")


def check_column_names(columns: Iterable[str], *, where: str) -> None:
    """Refuse a dataset column named like one of the reward call's own keywords (:data:`RESERVED_COLUMNS`).
    :meth:`RewardFunction.score` checks every batch with it, and ``marti train`` checks the dataset's columns
    with it before the job starts (``services/trainer/job/run/prechecks.py``).

    Args:
        columns: The column names.
        where: What the error message starts with (the reward function, or the dataset file).

    Raises:
        InvalidArgumentError: A column is named ``prompts`` or ``completions`` (the first such named).
    """
    clash = next((k for k in columns if k in RESERVED_COLUMNS), None)
    if clash is not None:
        raise InvalidArgumentError(
            f"{where}: dataset column {clash!r} collides with the keyword {clash}= of the reward function call "
            "fn(prompts=, completions=, **columns); rename the column"
        )


class RewardFunction:
    """One user reward function as a :class:`~marti.rewards.base.RewardScorer`.

    Args:
        fn: ``"file.py:fn"`` / ``"module:fn"`` (loaded now), or a callable.

    Attributes:
        path: The import path, or ``module:qualname`` of a callable given directly.
        name: ``"reward function 'PATH'"``, how errors name it.

    Raises:
        InvalidArgumentError: ``fn`` is a malformed path, names something that is not callable, or names a file
            or module that fails to run (a syntax error, a failed import inside it; file and line named).
        NotFoundError: The file, module or attribute does not exist (named).
    """

    @checked(own=("fn",))
    def __init__(self, fn: str | Callable[..., Any]) -> None:
        if isinstance(fn, str):
            self.path = fn
            self.fn = load_callable(fn)
        elif callable(fn):
            self.path = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
            self.fn = fn
        else:
            raise InvalidArgumentError(
                f"reward function must be 'file.py:fn', 'module:fn' or a callable, got {shorten(fn)}"
            )
        self.name = f"reward function {self.path!r}"

    @checked
    def score(
        self, prompts: Sequence[str], completions: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> list[float]:
        """Call ``fn(prompts=..., completions=..., **columns)`` and check that it returned one finite float per
        completion (arguments and result as :meth:`RewardScorer.score`; the ``prompt`` and ``completion``
        columns are not passed again).

        Raises:
            InvalidArgumentError: A column is named ``prompts`` or ``completions`` (it would collide with the
                call's keywords), the inputs disagree in length, the function raised (its exception named and
                chained, with the batch's first prompt), or it returned something other than B finite numbers
                (the index and value named).
            MartiError: The function raised a marti error: the same class, its message prefixed likewise.
        """
        n = check_batch(prompts, completions, columns, scorer=self.name)
        check_column_names(columns, where=self.name)
        kwargs = {k: list(v) for k, v in columns.items() if k not in _NOT_PASSED}
        try:
            scores = self.fn(prompts=list(prompts), completions=list(completions), **kwargs)
        except Exception as exc:
            raise self._failed(exc, prompts, kwargs) from exc
        return check_scores(scores, n, scorer=self.name)

    def _failed(self, exc: Exception, prompts: Sequence[str], kwargs: Mapping[str, Any]) -> MartiError:
        """The typed error for ``exc`` raised by the function: a marti error keeps its class, any other
        exception becomes :class:`InvalidArgumentError`; the message names the function, the exception, the
        batch size, the first prompt (shortened) and the keywords passed."""
        first = shorten(prompts[0], 60) if prompts else "(none)"
        message = (
            f"{self.name} raised {type(exc).__name__}: {exc} (scoring {len(prompts)} completions; first prompt "
            f"{first}; keywords: prompts, completions{''.join(', ' + k for k in kwargs)})"
        )
        if isinstance(exc, MartiError):
            err = copy.copy(exc)
            err.message, err.args = message, (message,)
            return err
        return InvalidArgumentError(message)


@checked(own=("fns",))
def reward_functions(
    fns: Sequence[str | Callable[..., Any]], weights: Sequence[float] | None = None
) -> WeightedSum:
    """Several reward functions summed with weights, as TRL's ``reward_funcs`` + ``reward_weights``.

    Args:
        fns: Import paths (``"file.py:fn"``, ``"module:fn"``) or callables; at least one.
        weights: One float per function; ``None`` = each 1.0.

    Returns:
        A scorer whose score for completion i is ``sum_k weights[k] * fns[k](...)[i]``.

    Raises:
        InvalidArgumentError / NotFoundError: A path that does not load (see :class:`RewardFunction`), no
            functions, or a weight count other than the function count.
    """
    if isinstance(fns, (str, bytes)) or callable(fns) or not isinstance(fns, Sequence):
        raise InvalidArgumentError(f"reward_functions: fns must be a list of functions, got {shorten(fns)}")
    return WeightedSum([RewardFunction(fn) for fn in fns], weights)
