"""``marti bench engine``: the float32 ``generate`` baseline without prefix sharing against the job's engines in
``rollout.dtype``, on the tiny random model (seconds)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import engine as bench


def test_arms_json_and_ratios_against_the_fp32_generate_baseline(tmp_path, capsys):
    out = tmp_path / "engine.json"
    assert bench.main(["--model", "tiny-llama", "--batches", "3", "--repeats", "1", "--max-new-tokens", "3",
                       "--dtype", "bfloat16", "--json", str(out)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["baseline"] == "generate_fp32" and set(data["by_batch"]) == {"3"}
    assert data["baseline_dtype"] == "float32" and data["sample_dtype"] == "bfloat16"
    for entry in data["by_batch"].values():
        arms = entry["arms"]
        assert set(arms) == {"generate_fp32", "hf", "hf_static"}
        assert arms["generate_fp32"]["ratio_tokens_per_s"] == 1.0
        assert all(a["generated_tokens"] > 0 and a["tokens_per_s"] > 0 for a in arms.values())
        phases = entry["hf_static_phases_s"]
        assert phases["prefill_s"] > 0 and phases["decode_s"] >= 0
    printed = capsys.readouterr().out
    assert "generate_fp32 (baseline)" in printed and "hf_static prefill" in printed


@pytest.mark.parametrize(
    ("setting", "fast_dtype"), [("bfloat16", torch.bfloat16), ("float32", torch.float32)]
)
def test_baseline_is_plain_fp32_generate_and_fast_arms_sample_in_the_setting(setting, fast_dtype):
    engines = bench.build_engines("tiny-llama", [4], compiled=False, dtype=setting)
    base = engines["generate_fp32"]
    base_model = base._agents["a"].model
    assert not base.share_prompt_prefix and next(base_model.parameters()).dtype == torch.float32
    fast = [engines["hf"], engines["hf_static"]]
    assert all(e.share_prompt_prefix and e.dtype == fast_dtype for e in fast)
    # one copy shared by the fast arms: the baseline's model itself when the setting is float32
    assert fast[0]._agents["a"].model is fast[1]._agents["a"].model
    assert (fast[0]._agents["a"].model is base_model) == (fast_dtype == torch.float32)


def test_bad_dtype_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["--model", "tiny-llama", "--dtype", "half"])
    assert info.value.code == 2 and "'half'" in capsys.readouterr().err
