"""The key reference of ``docs/config.md``: every config key with its type, default and meaning."""

from __future__ import annotations

import json
import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel

from marti.config.load import _is_model, _unwrap
from marti.config.schema import TrainConfig


def _type_name(tp: Any) -> str:
    """Readable type of a field for the docs: ``int >= 1``, ``float in (0, 1] | null``, ``"hf" | "vllm"``."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        bounds = []
        for m in meta:
            for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                if getattr(m, attr, None) is not None:
                    bounds.append(f"{sign} {getattr(m, attr)}")
            for inner in getattr(m, "metadata", ()):
                for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                    if getattr(inner, attr, None) is not None:
                        bounds.append(f"{sign} {getattr(inner, attr)}")
        return " ".join([_type_name(base), ", ".join(bounds)]).strip()
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    if _is_model(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def _default_text(info: Any) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    return "`null`" if value is None else f"`{json.dumps(value)}`"


def _strip_field_meta(info: Any) -> Any:
    """A field's annotation with its pydantic constraints put back (pydantic moves them to ``metadata``)."""
    if info.metadata:
        return Annotated[(info.annotation, *info.metadata)]
    return info.annotation


def config_reference_markdown() -> str:
    """Markdown tables of every config key (dotted path, type, default, description), one table per section.

    ``docs/config.md`` embeds this text between ``<!-- BEGIN KEYS -->`` and ``<!-- END KEYS -->``; a unit test
    keeps the two equal, so every key is documented with its current default.
    """
    sections: list[tuple[str, type[BaseModel]]] = [("", TrainConfig)]
    out: list[str] = []
    while sections:
        prefix, cls = sections.pop(0)
        title = prefix.rstrip(".") or "top level"
        out += [f"### `{title}`" if prefix else "### top level", "", "| key | type | default | meaning |"]
        out.append("| --- | --- | --- | --- |")
        for name, info in cls.model_fields.items():
            tp = _unwrap(info.annotation)
            item = _unwrap(typing.get_args(tp)[0]) if typing.get_origin(tp) is list else None
            if _is_model(tp):
                sections.append((f"{prefix}{name}.", tp))
            elif item is not None and _is_model(item):
                sections.append((f"{prefix}{name}.N.", item))
            desc = " ".join((info.description or "").split()).replace("|", "\\|")
            kind = _type_name(_strip_field_meta(info)).replace("|", "\\|")
            out.append(f"| `{prefix}{name}` | {kind} | {_default_text(info)} | {desc} |")
        out.append("")
    return "\n".join(out)
