"""A key written twice in a YAML config is refused naming the file, the key and both lines, everywhere marti
reads configs (``marti train``, ``marti store --config``, SubmitJob's text), instead of YAML keeping the last
(a second ``rollout:`` section silently dropped every key of the first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marti.config import config_from_text
from marti.errors import InvalidArgumentError
from marti.plumbing.yaml_load import load_yaml
from marti.types.experience import parse_tables_yaml

ROOT = Path(__file__).resolve().parents[2]


def _marti(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marti.command.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_marti_train_refuses_a_second_rollout_section_naming_both_lines(tmp_path):
    text = (ROOT / "examples" / "tiny.yaml").read_text()
    first = 1 + text.splitlines().index("rollout:")
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(text + "rollout: {max_staleness: 1}\n")
    last = len(cfg.read_text().splitlines())
    out = _marti("train", str(cfg), "--set", f"output.dir={tmp_path / 'run'}")
    assert out.returncode == 2, out
    lines = _lines(out.stderr)
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert (
        f"{cfg}: key 'rollout' is written twice in one mapping, at line {first} and line {last}" in lines[0]
    )
    assert not (tmp_path / "run").exists()


def test_marti_store_refuses_a_tables_file_with_a_key_twice(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text("tables:\n  - name: r\n    preset: queue\n    max_size: 10\n    max_size: 20\n")
    out = _marti("store", "--port", "0", "--config", str(path))
    assert out.returncode == 2, out
    lines = _lines(out.stderr)
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "key 'max_size' is written twice in one mapping, at line 4 and line 5" in lines[0]
    assert str(path) in lines[0]


def test_submit_job_text_with_a_nested_key_twice_is_refused():
    text = "training_name: x\nagents:\n  - {name: a, pretrain_model: tiny-llama, role: r, role: s}\n"
    with pytest.raises(
        InvalidArgumentError, match=r"<SubmitJob>: key 'role' is written twice.*line 3 and line 3"
    ):
        config_from_text(text, source="<SubmitJob>")


def test_merge_keys_and_equal_keys_in_different_mappings_are_fine():
    text = "base: &b {engine: hf, group_size: 2}\nrollout:\n  <<: *b\n  engine: vllm\nother: {engine: hf}\n"
    doc = load_yaml(text, "t")
    assert doc["rollout"] == {"engine": "vllm", "group_size": 2} and doc["other"] == {"engine": "hf"}
    assert parse_tables_yaml("tables:\n  - {name: a, preset: queue}\n  - {name: b, preset: queue}\n")


def test_an_override_of_a_merged_key_is_kept_when_its_mapping_is_merged_again_from_a_shallower_level():
    # PyYAML flattens an anchored mapping's node in place when a shallower mapping merges it first, which
    # made the override look like a duplicate; PyYAML 6.0.4's own merge also gave 'y' the overridden k: 0.
    text = "b: &b {k: 0}\nx:\n  inner: &a\n    <<: *b\n    k: 1\ny:\n  <<: *a\n"
    assert load_yaml(text, "cfg") == {"b": {"k": 0}, "x": {"inner": {"k": 1}}, "y": {"k": 1}}


def test_merge_precedence_explicit_then_earlier_source_and_duplicates_in_a_merged_mapping_refused():
    text = "a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc:\n  <<: [*a, *b]\n  z: 3\nd:\n  <<: *b\n  y: 4\n"
    doc = load_yaml(text, "cfg")
    assert doc["c"] == {"x": 1, "y": 2, "z": 3} and doc["d"] == {"x": 2, "y": 4}
    with pytest.raises(InvalidArgumentError, match=r"cfg: key 'k' is written twice.*line 2 and line 2"):
        load_yaml("c:\n  <<: {k: 1, k: 2}\n", "cfg")


def test_marti_train_refuses_a_set_value_with_a_key_twice_naming_the_override(tmp_path):
    value = "rollout={max_new_tokens: 4, max_new_tokens: 9}"
    out = _marti("train", "examples/tiny.yaml", "--set", value, "--set", f"output.dir={tmp_path / 'run'}")
    assert out.returncode == 2, out
    lines = _lines(out.stderr)
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"override {value!r}: key 'max_new_tokens' is written twice in one mapping" in lines[0]
    assert not (tmp_path / "run").exists()
    with pytest.raises(
        InvalidArgumentError, match=r"override 'agents.0.sampling=.*key 'temperature' is written"
    ):
        config_from_text(
            (ROOT / "examples" / "tiny.yaml").read_text(),
            ["agents.0.sampling={temperature: 0.2, temperature: 0.9}"],
        )


def test_only_true_and_false_are_booleans_so_a_switch_refuses_yes_and_off():
    doc = load_yaml("a: yes\nb: off\nc: On\nd: NO\ne: true\nf: False\ng: TRUE\nh: y\n", "t")
    assert doc == {"a": "yes", "b": "off", "c": "On", "d": "NO", "e": True, "f": False, "g": True, "h": "y"}
    for word in ("yes", "off"):
        with pytest.raises(
            InvalidArgumentError,
            match=rf"'policy.share_prompt_prefix': must be true or false \(got '{word}'\)",
        ):
            config_from_text(f"policy:\n  share_prompt_prefix: {word}\n")
