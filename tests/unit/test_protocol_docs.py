"""docs/protocol.md is generated from the proto comments and must be current (scripts/gen_protocol_docs.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pool

import marti.api.broker.v1.broker_service_pb2  # noqa: F401  (register descriptors)
import marti.api.env.v1.env_service_pb2  # noqa: F401
import marti.api.experience.v1.experience_service_pb2  # noqa: F401
import marti.api.trainer.v1.trainer_service_pb2  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_protocol_docs.py"
DOC = ROOT / "docs" / "protocol.md"
SERVICES = (
    "marti.api.broker.v1.BrokerService",
    "marti.api.env.v1.EnvService",
    "marti.api.experience.v1.ExperienceService",
    "marti.api.trainer.v1.TrainerService",
)


def _gen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_protocol_doc_is_current(tmp_path):
    out = tmp_path / "protocol.md"
    assert _gen("--out", str(out)).returncode == 0
    assert out.read_text() == DOC.read_text(), (
        "docs/protocol.md is stale: run python scripts/gen_protocol_docs.py"
    )
    assert _gen("--check").returncode == 0


def test_protocol_doc_lists_every_rpc_with_kind_and_codes():
    text = DOC.read_text()
    pool = descriptor_pool.Default()
    for name in SERVICES:
        service = pool.FindServiceByName(name)
        assert f"### Service `{name}`" in text
        for method in service.methods:
            assert f"#### `{name}.{method.name}`" in text, method.full_name
            assert f"- Full method name: `/{name}/{method.name}`." in text
    # codes named in rpc comments, in-band statuses on streams, units from names and comments
    submit = text.split("#### `marti.api.trainer.v1.TrainerService.SubmitJob`")[1].split("####")[0]
    assert "`INVALID_ARGUMENT`, `NOT_FOUND`, `RESOURCE_EXHAUSTED`" in submit and "unary" in submit
    sample = text.split("#### `marti.api.experience.v1.ExperienceService.Sample`")[1].split("####")[0]
    assert "bidirectional streaming" in sample and "In-band errors: `SampleResponse.status`" in sample
    assert "| `ttl_ms` | 10 | `uint64` | milliseconds |" in text
    assert "| `sent_at_unix_us` | 7 | `int64` | microseconds since the Unix epoch |" in text


def test_check_fails_when_a_comment_changes(tmp_path):
    protos = tmp_path / "protos"
    shutil.copytree(ROOT / "protos", protos)
    f = protos / "marti" / "api" / "env" / "v1" / "env_service.proto"
    f.write_text(f.read_text().replace("Closes a session (idempotent).", "Closes a session, idempotently."))
    stale = _gen("--check", "--proto-root", str(protos))
    assert stale.returncode == 1 and "out of date" in stale.stderr
    out = tmp_path / "p.md"
    assert _gen("--proto-root", str(protos), "--out", str(out)).returncode == 0
    assert "Closes a session, idempotently." in out.read_text()
