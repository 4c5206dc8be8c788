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
        assert set(arms) == {"generate_fp32", "hf", "hf_static", "hf_static_transformers"}
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
    fast = [engines["hf"], engines["hf_static"], engines["hf_static_transformers"]]
    assert all(e.share_prompt_prefix and e.dtype == fast_dtype for e in fast)
    assert engines["hf_static"].lean and not engines["hf_static_transformers"].lean
    # one copy shared by the fast arms: the baseline's model itself when the setting is float32
    assert fast[0]._agents["a"].model is fast[1]._agents["a"].model
    assert (fast[0]._agents["a"].model is base_model) == (fast_dtype == torch.float32)


def test_bad_dtype_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["--model", "tiny-llama", "--dtype", "half"])
    assert info.value.code == 2 and "'half'" in capsys.readouterr().err


def _no_run(*args, **kwargs):
    raise AssertionError("the benchmark ran")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be an integer >= 1, got 0"),
        (["--batches", "0"], "argument --batches: must be an integer >= 1, got 0"),
        (["--batches", "4,x"], "argument --batches: must be an integer >= 1, got 'x'"),
        (["--batches", ","], "argument --batches: must name at least one integer >= 1, got ','"),
        (["--batches", "2,8,2"], "argument --batches: names 2 more than once, got '2,8,2'"),
        (["--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
        (["--repeats", "-2"], "argument --repeats: must be an integer >= 1, got -2"),
        (["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json: the folder"),
    ],
)
def test_bad_values_are_refused_naming_them_before_the_benchmark_runs(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(bench, "run", _no_run)
    with pytest.raises(SystemExit) as info:
        bench.main(["--model", "tiny-llama", *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "device must be a torch device such as cpu or cuda, got 'tpu'"),
        ("cuda:0", "device 'cuda:0' asked for, but torch sees no CUDA device"),
    ],
)
def test_a_device_torch_cannot_use_is_refused_naming_it_before_the_benchmark_runs(
    device, message, monkeypatch, capsys
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "run", _no_run)
    with pytest.raises(SystemExit) as info:
        bench.main(["--model", "tiny-llama", "--device", device])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_max_new_tokens_given_replaces_the_configs_none_keeps_it_and_zero_is_not_none():
    from marti.errors import InvalidArgumentError
    from services.trainer.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-llama")
    config = str(bench.ROOT / "examples" / "resource_allocation.yaml")
    assert bench.demo_prompts(config, 1, tok, None)[1].max_new_tokens == 24
    assert bench.demo_prompts(config, 1, tok, 5)[1].max_new_tokens == 5
    with pytest.raises(InvalidArgumentError, match="max_new_tokens must be an int > 0, got 0"):
        bench.demo_prompts(config, 1, tok, 0)  # refused, not read as the config's 24
