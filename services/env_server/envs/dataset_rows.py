"""Config checks of the ``dataset_task`` env: its problem rows, its agents, and its verifier.

Every check raises :class:`marti.errors.InvalidArgumentError` naming the config key, the row (``row`` or
``rows[i]``) and the column, so a bad dataset is refused when the env is made rather than scored 0 later.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marti.errors import InvalidArgumentError
from marti.rewards.verifiers import VERIFIER_OPTIONS, BoundVerifier, make_verifier

#: Config keys that are verifier options (passed to :func:`marti.rewards.verifiers.make_verifier` when set).
VERIFIER_OPTION_KEYS = tuple(sorted({name for opts, _ in VERIFIER_OPTIONS.values() for name in opts}))


def problem_rows(config: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Return ``[(where, row)]`` from ``row`` or ``rows``, ``where`` naming the row in messages.

    Raises:
        InvalidArgumentError: Neither or both of ``row`` and ``rows`` set, ``rows`` empty, or an entry of
            ``rows`` that is not a dict.
    """
    row, rows = config["row"], config["rows"]
    if row is None and rows is None:
        raise InvalidArgumentError(
            "dataset_task needs config key 'row' (the problem's columns, a dict) or 'rows' (a list of them)"
        )
    if row is not None and rows is not None:
        raise InvalidArgumentError("dataset_task takes config key 'row' or 'rows', not both")
    if row is not None:
        return [("row", row)]
    if not rows:
        raise InvalidArgumentError("dataset_task config key 'rows' is empty: give at least one row")
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise InvalidArgumentError(
                f"dataset_task rows[{i}] must be a dict of columns, got {type(r).__name__}"
            )
    return [(f"rows[{i}]", dict(r)) for i, r in enumerate(rows)]


def _columns(row: Mapping[str, Any]) -> str:
    return ", ".join(sorted(map(str, row))) or "none"


def input_text(where: str, row: Mapping[str, Any], column: str) -> str:
    """Return the non-empty text of ``row[column]``.

    Raises:
        InvalidArgumentError: The column is missing (the row's columns are listed), not text, or empty.
    """
    if column not in row:
        raise InvalidArgumentError(
            f"dataset_task {where} has no input column {column!r} (its columns: {_columns(row)})"
        )
    value = row[column]
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(
            f"dataset_task {where} column {column!r} must be non-empty text, got {type(value).__name__} {value!r:.80}"
        )
    return value


def label_text(where: str, row: Mapping[str, Any], column: str) -> str:
    """Return ``row[column]`` as text (numbers are written with ``str``).

    Raises:
        InvalidArgumentError: The column is missing (the row's columns are listed) or is not text or a number.
    """
    if column not in row:
        raise InvalidArgumentError(
            f"dataset_task {where} has no label column {column!r} (its columns: {_columns(row)})"
        )
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidArgumentError(
            f"dataset_task {where} label column {column!r} must be text or a number, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    return str(value)


def agent_names(config: Mapping[str, Any]) -> list[str]:
    """Return the team: ``agents`` if given, else ``agent_1 .. agent_<num_agents>`` (one agent by default).

    Raises:
        InvalidArgumentError: ``agents`` empty, with a non-text, empty or repeated name, or not matching
            ``num_agents``.
    """
    names, n = config["agents"], config["num_agents"]
    if names is None:
        return [f"agent_{i + 1}" for i in range(n or 1)]
    if not names or any(not isinstance(a, str) or not a for a in names) or len(set(names)) != len(names):
        raise InvalidArgumentError(
            f"dataset_task config key 'agents' must be distinct non-empty names, got {names!r}"
        )
    if n is not None and n != len(names):
        raise InvalidArgumentError(f"dataset_task config keys disagree: num_agents={n} but agents={names!r}")
    return list(names)


def agent_columns(config: Mapping[str, Any], agents: list[str]) -> dict[str, str]:
    """Return agent -> the column it sees (``agent_inputs`` entries, else ``input_key``).

    Raises:
        InvalidArgumentError: ``agent_inputs`` names an agent not in the team, or a column that is not text.
    """
    extra = config["agent_inputs"] or {}
    for agent, column in extra.items():
        if agent not in agents:
            raise InvalidArgumentError(
                f"dataset_task agent_inputs names agent {agent!r}, not in the team ({', '.join(agents)})"
            )
        if not isinstance(column, str) or not column:
            raise InvalidArgumentError(
                f"dataset_task agent_inputs[{agent!r}] must be a column name, got {column!r}"
            )
    return {a: extra.get(a, config["input_key"]) for a in agents}


def team_verifier(config: Mapping[str, Any]) -> BoundVerifier:
    """Build the verifier named by config key ``verifier`` with the option keys that are set.

    Raises:
        InvalidArgumentError: An option the verifier does not take, a missing or bad option (named).
        FailedPreconditionError: ``math`` without math-verify installed.
    """
    options = {k: config[k] for k in VERIFIER_OPTION_KEYS if config[k] is not None}
    try:
        return make_verifier(config["verifier"], **options)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"dataset_task config: {e.message}") from None
