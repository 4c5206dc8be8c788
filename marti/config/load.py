"""Loading a training config: YAML text or files, dotted ``KEY=VALUE`` overrides, readable error messages."""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from marti.config.schema import TrainConfig
from marti.errors import InvalidArgumentError
from marti.plumbing.yaml_load import load_yaml, yaml_error_line


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) if loc else "<root>"


def _unwrap(annotation: Any) -> Any:
    """Strip Optional / Annotated from a field annotation, returning the inner type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _suggest(word: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _format_error(err: dict[str, Any], source: str) -> str:
    loc = _dotted(tuple(err["loc"]))
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(tuple(err["loc"])[:-1])
        hint = _suggest(str(err["loc"][-1]), parent.model_fields) if parent else ""
        return f"{source}: unknown key '{loc}'{hint}"
    if kind == "missing":
        return f"{source}: missing required key '{loc}'"
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "value_error" and (not err["loc"] or isinstance(err.get("input"), dict)):
        return f"{source}: {msg}"
    return f"{source}: '{loc}': {msg} (got {err.get('input')!r})"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model at a validation location, e.g. ``('agents', 0, 'sampling')`` -> SamplingOverrides."""
    cls: Any = TrainConfig
    for part in loc:
        if isinstance(part, int):
            continue
        if not _is_model(cls) or part not in cls.model_fields:
            return None
        tp = _unwrap(cls.model_fields[part].annotation)
        if typing.get_origin(tp) is list:
            tp = _unwrap(typing.get_args(tp)[0])
        cls = tp
    return cls if _is_model(cls) else None


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InvalidArgumentError(f"override {text!r} is not KEY=VALUE (e.g. algorithm.kl_coef=0.01)")
    parts = key.split(".")
    if any(not p for p in parts):
        raise InvalidArgumentError(f"override key {key!r} has an empty part")
    try:
        value = load_yaml(raw, f"override {text!r}") if raw.strip() else None
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(
            f"override {key}: value {raw!r} is not a YAML scalar or list: {yaml_error_line(exc)}"
        ) from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """Apply dotted ``KEY=VALUE`` overrides to a raw config mapping (a deep copy is returned).

    Keys are checked against the schema before anything is set: ``algorithm.kl_coef`` works even when the
    YAML file has no ``algorithm`` section; list items are addressed by index (``agents.0.role``) and the
    index must exist. Values are parsed as YAML (``0.01``, ``true``, ``null``, ``[a, b]``). Below a free-form
    mapping (``environment.options``) any key is accepted.

    Args:
        data: The raw mapping read from YAML (not modified).
        overrides: Strings ``dotted.key=value``, applied in order.

    Returns:
        The new raw mapping, still to be validated.

    Raises:
        InvalidArgumentError: Malformed override, unknown key (named, with a suggestion), a list index out of
            range, a key below a scalar value, or a value with a key written twice in one mapping (``--set
            'rollout={a: 1, a: 2}'``: ``override 'rollout={a: 1, a: 2}': key 'a' is written twice ...``).
    """
    out = yaml.safe_load(yaml.safe_dump(data)) if data else {}
    for text in overrides:
        parts, value = _parse_override(text)
        _set_path(out, parts, value)
    return out


def unset_keys(
    data: dict[str, Any], keys: typing.Sequence[str], given: typing.Sequence[str] = ()
) -> dict[str, Any]:
    """Drop dotted keys from a raw config mapping (a deep copy is returned), so that each takes its default:
    ``--unset KEY`` of ``marti train`` / ``marti eval``, e.g. a YAML file's ``policy.lora_r`` under ``--set
    policy.mode=per_agent`` (docs/config.md, "Dotted overrides").

    Keys are checked against the schema as :func:`apply_overrides` checks them (the same messages, naming
    ``--unset``); list items are addressed by index (``agents.0.ref_model``).

    Args:
        data: The raw mapping read from YAML (not modified).
        keys: Dotted keys to drop.
        given: ``KEY=VALUE`` overrides applied after (``--set``, launch flags): none may set an unset key, or a
            key above or below it.

    Returns:
        The new raw mapping, still to be validated.

    Raises:
        InvalidArgumentError: An unknown key (named, with a suggestion), a key the mapping does not set (unsetting
            it would do nothing), a whole list item, or a key that an override in ``given`` sets too.
    """
    if not keys:
        return data
    out = yaml.safe_load(yaml.safe_dump(data)) if data else {}
    for key in keys:
        parts = key.strip().split(".")
        if any(not p for p in parts):
            raise InvalidArgumentError(f"--unset key {key!r} has an empty part")
        for text in given:
            other = text.partition("=")[0].strip().split(".")
            if other[: len(parts)] == parts or parts[: len(other)] == other:
                raise InvalidArgumentError(
                    f"--unset {key} and the override {text!r} both set '{'.'.join(other)}': give one of them"
                )
        _set_path(out, parts, None, unset=True)
    return out


def _not_set(key: str) -> InvalidArgumentError:
    """The error of ``--unset KEY`` where the config does not set ``key``: unsetting it would do nothing."""
    return InvalidArgumentError(
        f"--unset {key}: the config does not set '{key}' (it has its default already): drop --unset {key}"
    )


def _leaf(node: Any, part: Any, value: Any, key: str, unset: bool) -> None:
    """Set ``node[part]`` to ``value``, or with ``unset`` delete it (refused where ``node`` does not set it)."""
    if not unset:
        node[part] = value
    elif part not in node:
        raise _not_set(key)
    else:
        del node[part]


def _child(node: dict[str, Any], part: str, kind: type, key: str, unset: bool) -> Any:
    """``node[part]``, made an empty ``kind`` (dict or list) where it is missing (a dict also where it is not one);
    with ``unset`` a missing one is an empty ``kind`` left out of ``node``, so the rest of the key is still checked
    against the schema (an unknown key is named as such) before the leaf is refused as not set."""
    current = node.get(part)
    if isinstance(current, kind):
        return current
    if unset:
        return kind()
    if kind is list and current is not None:
        return current
    node[part] = kind()
    return node[part]


def _set_path(root: dict[str, Any], parts: list[str], value: Any, *, unset: bool = False) -> None:
    cls: Any = TrainConfig
    node: Any = root
    key = ".".join(parts)
    label = f"--unset '{key}'" if unset else f"override '{key}'"
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join(parts[: i + 1])
        if cls is dict:  # free-form mapping: any key
            if last:
                _leaf(node, part, value, key, unset)
            else:
                node = _child(node, part, dict, key, unset)
            continue
        if _is_model(cls):
            if part not in cls.model_fields:
                raise InvalidArgumentError(
                    f"unknown config key '{here}' in {label}{_suggest(part, cls.model_fields)}"
                )
            if last:
                _leaf(node, part, value, key, unset)
                return
            tp = _unwrap(cls.model_fields[part].annotation)
            origin = typing.get_origin(tp)
            if _is_model(tp) or tp is dict or origin is dict:
                node = _child(node, part, dict, key, unset)
                cls = tp if _is_model(tp) else dict
            elif origin is list:
                node, cls = _child(node, part, list, key, unset), ("list", _unwrap(typing.get_args(tp)[0]))
            else:
                raise InvalidArgumentError(f"{label}: '{here}' is a single value, it has no sub-keys")
            continue
        # list node: part must be an index
        item_type = cls[1]
        if not part.isdigit():
            raise InvalidArgumentError(f"{label}: '{part}' must be a list index 0..{len(node) - 1}")
        idx = int(part)
        if idx >= len(node):
            raise InvalidArgumentError(
                f"{label}: index {idx} out of range, '{'.'.join(parts[:i])}' has {len(node)} items"
            )
        if last:
            if unset:
                raise InvalidArgumentError(f"{label}: a whole list item cannot be unset; edit the list")
            node[idx] = value
            return
        if not _is_model(item_type):
            raise InvalidArgumentError(f"{label}: '{here}' is a single value, it has no sub-keys")
        if not isinstance(node[idx], dict):
            raise InvalidArgumentError(f"{label}: '{here}' is not a mapping (got {node[idx]!r})")
        node, cls = node[idx], item_type


def config_from_dict(
    data: dict[str, Any],
    overrides: typing.Sequence[str] = (),
    *,
    source: str = "<config>",
    unset: typing.Sequence[str] = (),
) -> TrainConfig:
    """Validate a raw mapping (plus dotted overrides) into a :class:`TrainConfig`.

    Args:
        data: The raw config mapping, as read from YAML.
        overrides: Dotted ``KEY=VALUE`` overrides (see :func:`apply_overrides`).
        source: Name used in error messages (the file path).
        unset: Dotted keys dropped from ``data`` before the overrides (see :func:`unset_keys`).

    Returns:
        The validated, frozen config.

    Raises:
        InvalidArgumentError: Every problem found, one per line, each naming the dotted key and bad value.
    """
    _check_mapping(data, source)
    raw = apply_overrides(unset_keys(data, unset, overrides), overrides)
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [_format_error(e, source) for e in exc.errors(include_url=False)]
        raise InvalidArgumentError("\n".join(lines)) from None


def config_from_text(
    text: str,
    overrides: typing.Sequence[str] = (),
    *,
    source: str = "<text>",
    unset: typing.Sequence[str] = (),
) -> TrainConfig:
    """Parse YAML text into a :class:`TrainConfig` (used by TrainerService.SubmitJob).

    Raises:
        InvalidArgumentError: The text is not valid YAML, writes a key twice in one mapping (the key and both
            lines named, :func:`marti.plumbing.yaml_load.load_yaml`), or the config is invalid (see
            :func:`config_from_dict`).
    """
    return config_from_dict(raw_config_from_text(text, source), overrides, source=source, unset=unset)


def raw_config_from_text(text: str, source: str = "<text>") -> dict[str, Any]:
    """The raw config mapping of YAML text (empty text: ``{}``), not yet validated.

    Raises:
        InvalidArgumentError: The text is not valid YAML, writes a key twice in one mapping (the key and both
            lines named, :func:`marti.plumbing.yaml_load.load_yaml`), or is not a mapping; ``source`` is named.
    """
    try:
        data = load_yaml(text, source)
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"{source}: not valid YAML: {yaml_error_line(exc)}") from None
    data = {} if data is None else data
    _check_mapping(data, source)
    return data


def _check_mapping(data: Any, source: str) -> None:
    """Refuse a config that is not a mapping (``source`` and the type named)."""
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{source}: the config must be a YAML mapping, got {type(data).__name__}")


def load_config(
    path: str | Path, overrides: typing.Sequence[str] = (), unset: typing.Sequence[str] = ()
) -> TrainConfig:
    """Load a YAML training config file and apply dotted overrides (``--set algorithm.kl_coef=0.01``).

    Args:
        path: The YAML file.
        overrides: ``KEY=VALUE`` strings, applied in order after the file is read.
        unset: Dotted keys dropped from the file before the overrides (``--unset``, :func:`unset_keys`).

    Returns:
        The validated, frozen :class:`TrainConfig`.

    Raises:
        InvalidArgumentError: The file is missing or unreadable, is not YAML, writes a key twice in one mapping
            (the key and both lines named), or the config is invalid; the message names the file, the dotted key
            and the bad value.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read config file {str(p)!r}: {exc.strerror or exc}") from None
    return config_from_text(text, overrides, source=str(p), unset=unset)


def dump_config(config: TrainConfig) -> str:
    """Render a config as YAML text that :func:`config_from_text` reads back to an equal config."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
