"""Generate ``docs/protocol.md`` from the comments of the ``.proto`` files under ``protos/``.

The protos are compiled with ``grpc_tools.protoc --include_source_info`` into a ``FileDescriptorSet``; the
comments attached to services, rpcs, messages, fields, enums and enum values are read from its
``SourceCodeInfo`` and rendered as Markdown: every rpc with its request and response, its stream semantics and
the status codes it can return, every message with its fields (type, number, unit) and every enum.

Usage::

    python scripts/gen_protocol_docs.py            # rewrite docs/protocol.md
    python scripts/gen_protocol_docs.py --check    # exit 1 if docs/protocol.md is out of date
    python scripts/gen_protocol_docs.py --out F    # write elsewhere
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import google.rpc
import grpc_tools
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
DEFAULT_OUT = ROOT / "docs" / "protocol.md"

#: Canonical gRPC status code names (google.rpc.Code), in code order.
STATUS_CODES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
_CODE_RE = re.compile(r"\b(" + "|".join(c for c in STATUS_CODES if c != "OK") + r")\b")

#: Codes any rpc can return, whatever its comment says, and why (rendered once at the top).
COMMON_CODES = (
    (
        "UNAUTHENTICATED",
        "the server runs with a token and the call has no valid `authorization: Bearer` header",
    ),
    ("INVALID_ARGUMENT", "a request field is malformed; the message names the field and the bad value"),
    (
        "RESOURCE_EXHAUSTED",
        "a message is larger than the channel limit (`max_message_bytes`, 64 MiB default)",
    ),
    ("DEADLINE_EXCEEDED", "the client's deadline passed"),
    ("UNAVAILABLE", "the server is not reachable or is shutting down (safe to retry idempotent rpcs)"),
    ("CANCELLED", "the client cancelled the call"),
    ("INTERNAL", "a server bug; the message names the exception"),
)

#: Unit implied by a field-name suffix (checked in order; the first match wins).
UNIT_SUFFIXES = (
    ("_unix_us", "microseconds since the Unix epoch"),
    ("_at_s", "seconds since the Unix epoch"),
    ("_ms", "milliseconds"),
    ("_us", "microseconds"),
    ("_s", "seconds"),
    ("_bytes", "bytes"),
    ("_i32le", "little-endian int32 array"),
    ("_f32le", "little-endian float32 array"),
)
#: Unit named in a comment, when the name has no unit suffix.
UNIT_WORDS = (
    ("milliseconds", "milliseconds"),
    (" ms", "milliseconds"),
    ("microseconds", "microseconds"),
    ("seconds", "seconds"),
    ("characters", "characters"),
    ("bytes", "bytes"),
)

_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


class ProtocolDocError(Exception):
    """protoc failed, or a proto element needed for the docs is missing."""


def compile_descriptor_set(proto_root: Path = PROTO_ROOT) -> descriptor_pb2.FileDescriptorSet:
    """Compile every ``.proto`` under ``proto_root`` with source info (comments) and return the descriptors.

    Args:
        proto_root: The proto import root (holds ``marti/api/<area>/v1/*.proto``).

    Returns:
        A ``FileDescriptorSet`` with ``source_code_info`` for the marti files (imports included without).

    Raises:
        ProtocolDocError: No proto files, or protoc reports an error.
    """
    files = sorted(p.relative_to(proto_root).as_posix() for p in proto_root.rglob("*.proto"))
    if not files:
        raise ProtocolDocError(f"no .proto files under {proto_root}")
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        deps = Path(tmp) / "deps" / "google" / "rpc"
        deps.mkdir(parents=True)
        shutil.copy(Path(list(google.rpc.__path__)[0]) / "status.proto", deps / "status.proto")
        out = Path(tmp) / "set.pb"
        args = [
            "protoc", f"-I{proto_root}", f"-I{Path(tmp) / 'deps'}", f"-I{wkt}", "--include_source_info",
            f"--descriptor_set_out={out}", *files,
        ]  # fmt: skip
        if protoc.main(args) != 0:
            raise ProtocolDocError(f"protoc failed on {proto_root}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _clean(comment: str) -> str:
    return " ".join(line.strip() for line in comment.strip().splitlines()).strip()


@dataclass
class FileDocs:
    """Comments of one proto file, by descriptor path (tuple of ints, as in ``SourceCodeInfo``)."""

    proto: descriptor_pb2.FileDescriptorProto
    comments: dict[tuple[int, ...], str] = field(default_factory=dict)

    @classmethod
    def of(cls, proto: descriptor_pb2.FileDescriptorProto) -> FileDocs:
        """Index the leading (else trailing) comment of every element of ``proto``."""
        docs = cls(proto)
        for loc in proto.source_code_info.location:
            text = loc.leading_comments or loc.trailing_comments
            if text:
                docs.comments[tuple(loc.path)] = _clean(text)
        return docs

    def comment(self, *path: int) -> str:
        """The comment at ``path`` ("" when absent)."""
        return self.comments.get(tuple(path), "")


def _unit(name: str, comment: str) -> str:
    for suffix, unit in UNIT_SUFFIXES:
        if name.endswith(suffix):
            return unit
    low = " " + comment.lower()
    for word, unit in UNIT_WORDS:
        if word in low:
            return unit
    return ""


def _type_name(f: descriptor_pb2.FieldDescriptorProto, maps: dict[str, tuple[str, str]]) -> str:
    if f.type_name:
        name = f.type_name.lstrip(".")
        if name in maps:
            k, v = maps[name]
            return f"map<{k}, {v}>"
        return name
    return _SCALARS[f.type]


def _codes(text: str) -> list[str]:
    return sorted(set(_CODE_RE.findall(text)), key=STATUS_CODES.index)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def _link(type_name: str, known: set[str]) -> str:
    return f"[`{type_name}`](#{_anchor(type_name)})" if type_name in known else f"`{type_name}`"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


class Renderer:
    """Builds the Markdown of the marti protocol from a compiled descriptor set."""

    def __init__(self, fds: descriptor_pb2.FileDescriptorSet) -> None:
        files = [f for f in fds.file if f.package.startswith("marti.")]
        # by package; in each, the service file first (rpcs before the messages they use)
        files.sort(key=lambda f: (f.package, not f.name.endswith("_service.proto"), f.name))
        self.files = [FileDocs.of(f) for f in files]
        self.messages: dict[str, tuple[FileDocs, descriptor_pb2.DescriptorProto, tuple[int, ...]]] = {}
        self.enums: dict[str, tuple[FileDocs, descriptor_pb2.EnumDescriptorProto, tuple[int, ...]]] = {}
        self.maps: dict[str, tuple[str, str]] = {}
        for fd in self.files:
            for i, m in enumerate(fd.proto.message_type):
                self._index_message(fd, m, f"{fd.proto.package}.{m.name}", (4, i))
            for i, e in enumerate(fd.proto.enum_type):
                self.enums[f"{fd.proto.package}.{e.name}"] = (fd, e, (5, i))
        for full, (_, m, _) in self.messages.items():
            if m.options.map_entry:
                k, v = m.field
                self.maps[full] = (_type_name(k, {}), _type_name(v, self.maps))
        self.known = set(self.messages) | set(self.enums)

    def _index_message(self, fd: FileDocs, m, full: str, path: tuple[int, ...]) -> None:
        self.messages[full] = (fd, m, path)
        for i, n in enumerate(m.nested_type):
            self._index_message(fd, n, f"{full}.{n.name}", (*path, 3, i))
        for i, e in enumerate(m.enum_type):
            self.enums[f"{full}.{e.name}"] = (fd, e, (*path, 4, i))

    def _status_fields(self, full: str, seen: set[str] | None = None) -> list[tuple[str, str]]:
        """``(field path, comment)`` of every google.rpc.Status field reachable from message ``full``."""
        seen = seen if seen is not None else set()
        if full in seen or full not in self.messages:
            return []
        seen.add(full)
        fd, m, path = self.messages[full]
        out = []
        for j, f in enumerate(m.field):
            t = f.type_name.lstrip(".")
            if t == "google.rpc.Status":
                out.append((f"{m.name}.{f.name}", fd.comment(*path, 2, j)))
            elif t in self.messages:
                out += self._status_fields(t, seen)
        return out

    def _stream_kind(self, rpc: descriptor_pb2.MethodDescriptorProto) -> str:
        return {
            (False, False): "unary",
            (False, True): "server streaming",
            (True, False): "client streaming",
            (True, True): "bidirectional streaming",
        }[(rpc.client_streaming, rpc.server_streaming)]

    def _request_codes(self, full: str) -> list[str]:
        fd, m, path = self.messages[full]
        text = " ".join(fd.comment(*path, 2, j) for j in range(len(m.field)))
        return _codes(text)

    def render_service(self, fd: FileDocs, si: int, s: descriptor_pb2.ServiceDescriptorProto) -> list[str]:
        """Markdown of one service and its rpcs."""
        full = f"{fd.proto.package}.{s.name}"
        lines = [f"### Service `{full}`", "", fd.comment(6, si), ""]
        lines += ["| rpc | request | response | kind |", "| --- | --- | --- | --- |"]
        for rpc in s.method:
            req, resp = rpc.input_type.lstrip("."), rpc.output_type.lstrip(".")
            lines.append(
                f"| [`{rpc.name}`](#{_anchor(full + '.' + rpc.name)}) | {_link(req, self.known)} | "
                f"{_link(resp, self.known)} | {self._stream_kind(rpc)} |"
            )
        lines.append("")
        for mi, rpc in enumerate(s.method):
            req, resp = rpc.input_type.lstrip("."), rpc.output_type.lstrip(".")
            comment = fd.comment(6, si, 2, mi)
            lines += [f"#### `{full}.{rpc.name}`", "", comment, ""]
            call = "stream " if rpc.client_streaming else ""
            back = "stream " if rpc.server_streaming else ""
            lines.append(
                f"- Call: `{rpc.name}({call}{req}) returns ({back}{resp})`, {self._stream_kind(rpc)}."
            )
            lines.append(f"- Full method name: `/{full}/{rpc.name}`.")
            inband = self._status_fields(resp)
            if inband:
                where = ", ".join(f"`{p}`" for p, _ in inband)
                inband_codes = _codes(" ".join(c for _, c in inband) + " " + comment)
                lines.append(
                    f"- In-band errors: {where} (`google.rpc.Status`); a failed item does not end the "
                    + ("stream" if rpc.server_streaming or rpc.client_streaming else "call")
                    + (f"; codes named: {', '.join(inband_codes)}." if inband_codes else ".")
                )
            declared = _codes(comment)
            from_fields = [c for c in self._request_codes(req) if c not in declared]
            codes = declared + from_fields
            lines.append(
                "- Status codes: "
                + (", ".join(f"`{c}`" for c in codes) if codes else "none beyond the common codes")
                + " (plus the [common codes](#status-codes))."
            )
            lines.append("")
        return lines

    def render_message(self, full: str) -> list[str]:
        """Markdown of one message: its comment and a field table."""
        fd, m, path = self.messages[full]
        lines = [f"#### `{full}`", "", fd.comment(*path) or "(no comment)", ""]
        if not m.field:
            return [*lines, "No fields.", ""]
        lines += ["| field | number | type | unit | description |", "| --- | --- | --- | --- | --- |"]
        for j, f in enumerate(m.field):
            comment = fd.comment(*path, 2, j)
            t = _type_name(f, self.maps)
            shown = _link(t, self.known) if not t.startswith("map<") else f"`{t}`"
            if f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED and not t.startswith("map<"):
                shown = "repeated " + shown
            if f.proto3_optional:
                shown = "optional " + shown
            elif f.HasField("oneof_index"):
                shown += f" (oneof `{m.oneof_decl[f.oneof_index].name}`)"
            lines.append(
                f"| `{f.name}` | {f.number} | {shown} | {_unit(f.name, comment)} | {_escape(comment)} |"
            )
        if m.reserved_name or m.reserved_range:
            nums = ", ".join(
                str(r.start) if r.end == r.start + 1 else f"{r.start}-{r.end - 1}" for r in m.reserved_range
            )
            names = ", ".join(f"`{n}`" for n in m.reserved_name)
            lines += ["", f"Reserved: {', '.join(x for x in (nums, names) if x)}."]
        return [*lines, ""]

    def render_enum(self, full: str) -> list[str]:
        """Markdown of one enum and its values."""
        fd, e, path = self.enums[full]
        lines = [f"#### `{full}`", "", fd.comment(*path), "", "| value | number | description |"]
        lines.append("| --- | --- | --- |")
        for k, v in enumerate(e.value):
            lines.append(f"| `{v.name}` | {v.number} | {_escape(fd.comment(*path, 2, k))} |")
        return [*lines, ""]

    def render(self) -> str:
        """The whole document."""
        out = [
            "# marti protocol reference",
            "",
            "<!-- GENERATED by scripts/gen_protocol_docs.py from protos/; do not edit. -->",
            "",
            "Generated from the comments of the `.proto` files under `protos/` (the source of truth). Field "
            "names are the proto names; units come from the name suffix (`_ms`, `_s`, `_bytes`, ...) or the "
            "comment. Every service also serves `grpc.health.v1.Health` and server reflection "
            "(`grpc.reflection.v1alpha.ServerReflection`), so generic tools can list and describe it. "
            "See `docs/write_your_own_client.md` for a client from the protos alone.",
            "",
            "## Status codes",
            "",
            "Servers map domain errors to gRPC status codes in one table (`marti/rpc/errors.py`); the status "
            "message names the bad value and the limit it broke. Besides the codes listed per rpc, any rpc can "
            "return:",
            "",
            "| code | when |",
            "| --- | --- |",
            *[f"| `{c}` | {why} |" for c, why in COMMON_CODES],
            "",
            "Long-lived streams report per-item errors in-band as `google.rpc.Status` fields (listed per rpc "
            "below) and keep going; only fatal errors end a stream with a status code.",
            "",
            "## Contents",
            "",
        ]
        for fd in self.files:
            out.append(f"- [`{fd.proto.name}`](#{_anchor(fd.proto.name)}) (package `{fd.proto.package}`)")
        out.append("")
        for fd in self.files:
            out += [f"## {fd.proto.name}", "", f"Package `{fd.proto.package}`. {fd.comment(2)}".strip(), ""]
            for si, s in enumerate(fd.proto.service):
                out += self.render_service(fd, si, s)
            names = [n for n, (f, m, _) in self.messages.items() if f is fd and not m.options.map_entry]
            if names:
                out += ["### Messages", ""]
                for n in names:
                    out += self.render_message(n)
            enums = [n for n, (f, _, _) in self.enums.items() if f is fd]
            if enums:
                out += ["### Enums", ""]
                for n in enums:
                    out += self.render_enum(n)
        text = "\n".join(out)
        return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def generate(proto_root: Path = PROTO_ROOT) -> str:
    """Return the Markdown reference for the protos under ``proto_root``."""
    return Renderer(compile_descriptor_set(proto_root)).render()


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the protocol reference; returns the exit code."""
    p = argparse.ArgumentParser(description="Generate docs/protocol.md from the proto comments.")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output file (default docs/protocol.md)")
    p.add_argument("--check", action="store_true", help="exit 1 if the output file is not up to date")
    p.add_argument("--proto-root", type=Path, default=PROTO_ROOT)
    args = p.parse_args(argv)
    text = generate(args.proto_root)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python scripts/gen_protocol_docs.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
