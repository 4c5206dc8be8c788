"""The one YAML reader of marti's config files: PyYAML's safe loader, refusing a key written twice, with YAML 1.2's
booleans.

Plain ``yaml.safe_load`` keeps the last of two equal keys of a mapping without a word, so a second ``rollout:``
section appended to a training config silently drops every key of the first. Every config marti reads (training
configs from ``marti train``, launch flags and ``SubmitJob``, the store's tables YAML, a run folder's
``config.yaml``) goes through :func:`load_yaml`, which refuses that with an error naming the document, the key and
both lines. Only ``true`` and ``false`` (any case: ``True``, ``FALSE``) are booleans, as in YAML 1.2; PyYAML's
YAML 1.1 resolver would also read ``yes``, ``no``, ``on`` and ``off`` as booleans, so ``share_prompt_prefix: off``
or ``--set policy.share_prompt_prefix=yes`` passed a config's "a switch takes only true or false" rule. They are
strings here, which a switch refuses by name.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from marti.errors import InvalidArgumentError

__all__ = ["load_yaml"]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_STR_TAG = "tag:yaml.org,2002:str"


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping and resolves ``<<`` merges by YAML's rules.

    A merged key overridden by an explicit one is not a duplicate (``<<: *base`` then ``engine: vllm``).
    """

    source = "<yaml>"

    def construct_document(self, node: yaml.Node) -> Any:
        """Check every mapping of the composed document for a key written twice, then construct it.

        The check walks the node graph as written (each node once, aliases included), so a mapping that is
        only ever merged (``<<: {k: 1, k: 2}``) is checked too; ``<<`` keys themselves are not compared.

        Raises:
            InvalidArgumentError: A key appears twice (the document, the key and both 1-based lines named).
        """
        _check_document(self, node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        """Build a mapping with its ``<<`` merges resolved without changing any node.

        Explicit keys override merged ones; of the mappings merged (``<<: [*a, *b]``, or two ``<<`` keys), the
        earlier one wins. PyYAML's own ``flatten_mapping`` rewrites an anchored node in place and then drops
        merged keys by string identity, so a mapping merging ``*a`` got the key ``a`` had merged instead of the
        one ``a`` wrote over it.

        Raises:
            yaml.constructor.ConstructorError: ``<<`` names something other than a mapping or a list of them,
                or a key is unhashable.
        """
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        flat = yaml.MappingNode(node.tag, _merged_pairs(node, set()), node.start_mark, node.end_mark)
        return yaml.constructor.BaseConstructor.construct_mapping(self, flat, deep=deep)


def _merged_pairs(node: yaml.MappingNode, open_nodes: set[int]) -> list[tuple[yaml.Node, yaml.Node]]:
    """The (key, value) node pairs of ``node`` with its ``<<`` merges expanded, lowest precedence first.

    A dict built from the list in order (last wins) gives the YAML merge result: the merged mappings' pairs
    come first, the latest-written merge source first, then ``node``'s own keys. A mapping that merges itself
    (through an alias) adds nothing the second time.
    """
    open_nodes = open_nodes | {id(node)}
    sources: list[yaml.MappingNode] = []
    own: list[tuple[yaml.Node, yaml.Node]] = []
    for key_node, value_node in node.value:
        if key_node.tag != _MERGE_TAG:
            own.append((_as_key(key_node), value_node))
            continue
        items = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for item in items:
            if not isinstance(item, yaml.MappingNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"expected a mapping or list of mappings for merging, but found {item.id}",
                    item.start_mark,
                )
            sources.append(item)
    merged = [
        pair
        for src in reversed(sources)
        if id(src) not in open_nodes
        for pair in _merged_pairs(src, open_nodes)
    ]
    return merged + own


def _as_key(key_node: yaml.Node) -> yaml.Node:
    """``key_node``, or a plain-string copy of it when it is YAML's ``=`` value key (as PyYAML reads it)."""
    if key_node.tag != _VALUE_TAG:
        return key_node
    return yaml.ScalarNode(_STR_TAG, key_node.value, key_node.start_mark, key_node.end_mark)


_BOOL_TAG = "tag:yaml.org,2002:bool"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _check_document(loader: _UniqueKeyLoader, root: yaml.Node) -> None:
    """Check each mapping node reachable from ``root`` once (aliases share nodes; a recursive one is fine)."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            _check_unique_keys(loader, node)
            for key_node, value_node in node.value:
                todo.extend((key_node, value_node))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)


def _check_unique_keys(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> None:
    """Raise when two scalar keys of ``node`` (as written, ``<<`` skipped) construct to equal values.

    Only scalar keys are compared: a sequence or mapping key is unhashable, which PyYAML itself refuses.
    """
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(_as_key(key_node), deep=True)
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


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """One line for a YAML syntax error, for a message that has already named the file: its problem and where
    (``expected ',' or '}', but got ':' at line 4, column 10``), with what the parser was inside when that is
    elsewhere (``(while parsing a flow mapping at line 3, column 5)``); PyYAML's own text repeats a placeholder
    file name (``in "<unicode string>"``) and spans several lines. An error without a position: its text on
    one line.
    """
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if not problem or mark is None:
        return " ".join(str(exc).split())
    out = f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    context, where = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and where is not None and (where.line, where.column) != (mark.line, mark.column):
        out += f" ({context} at line {where.line + 1}, column {where.column + 1})"
    return out
