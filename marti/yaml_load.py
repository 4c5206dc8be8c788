"""The one YAML reader of marti's config files: PyYAML's safe loader, refusing a key written twice.

Plain ``yaml.safe_load`` keeps the last of two equal keys of a mapping without a word, so a second ``rollout:``
section appended to a training config silently drops every key of the first. Every config marti reads (training
configs from ``marti train``, launch flags and ``SubmitJob``, the store's tables YAML, a run folder's
``config.yaml``) goes through :func:`load_yaml`, which refuses that with an error naming the document, the key and
both lines.
"""

from __future__ import annotations

from typing import Any

import yaml

from marti.errors import InvalidArgumentError

__all__ = ["load_yaml"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose mappings refuse a key written twice (merge keys ``<<`` are left to YAML)."""

    source = "<yaml>"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Build a mapping after checking that no key appears twice in ``node``.

        Raises:
            InvalidArgumentError: A key appears twice (the document, the key and both 1-based lines named).
        """
        if isinstance(node, yaml.MappingNode):
            _check_unique_keys(self, node)
        return super().construct_mapping(node, deep=deep)


def _check_unique_keys(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> None:
    """Raise when two keys of ``node`` (as written, before ``<<`` merges) construct to equal values."""
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # PyYAML itself refuses an unhashable key, with its position
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise InvalidArgumentError(
                f"{loader.source}: key {key!r} is written twice in one mapping, at line {first_line[key]} and "
                f"line {line}; YAML would silently keep only the last: remove one or merge them"
            )
        first_line[key] = line


def load_yaml(text: str, source: str) -> Any:
    """Parse one YAML document as ``yaml.safe_load`` does, refusing duplicate mapping keys.

    Args:
        text: The YAML text.
        source: What the error calls the document (e.g. ``"config 'examples/tiny.yaml'"`` or a path).

    Returns:
        The parsed document (None for an empty one).

    Raises:
        InvalidArgumentError: A mapping has a key twice: ``"<source>: key 'rollout' is written twice in one
            mapping, at line 22 and line 26; ..."``.
        yaml.YAMLError: The text is not valid YAML (callers word it their own way).
    """
    loader = _UniqueKeyLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
