"""The trainer benchmark: the task's reward, the 'equal or better reward' verdict, the report of every arm, and
our side's ``--engine`` / ``--dtype`` really applied (a tiny run, its dtypes observed)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import trainer
from benchmarks.trainer import cli, ours, sum_task
from benchmarks.trainer.dtype_probe import DtypeProbe
from benchmarks.trainer.report import reward_comparison
from services.trainer.rollout.engines.precision import cpu_has_bf16


def _side(tail, scores):
    return {
        "tail_rewards": tail,
        "tail_reward": sum(tail) / len(tail),
        "eval_scores": scores,
        "eval_reward": sum(scores) / len(scores),
    }


def test_task_reward_scores_the_first_integer():
    assert sum_task.reward("The answer is 35.", 35) == sum_task.CORRECT_REWARD
    assert sum_task.reward("34, no 35", 35) == sum_task.NUMBER_REWARD
    assert sum_task.reward("thirty-five", 35) == 0.0
    problems = sum_task.make_problems(3, 5)
    assert problems == sum_task.make_problems(3, 5) and len(problems) == 5
    with pytest.raises(ValueError):
        sum_task.make_problems(0, -1)


def test_a_difference_inside_one_standard_error_counts_as_equal():
    ours = _side([0.088, 0.081, 0.144, 0.1], [0.1, 0.1, 1.0, 0.1])
    trl = _side([0.138, 0.088, 0.088, 0.1], [0.1, 0.1, 1.0, 0.1])
    ok, text = reward_comparison(ours, trl)
    assert ok and "training -0.000" in text and "held-out +0.000 (paired SE 0.000)" in text


def test_a_clearly_lower_reward_is_not_equal():
    ours = _side([0.05, 0.05, 0.05, 0.05], [0.1, 0.1, 0.1, 0.1])
    trl = _side([0.3, 0.31, 0.29, 0.3], [0.1, 0.1, 0.1, 0.1])
    assert not reward_comparison(ours, trl)[0]
    # Held-out, paired per problem: TRL right on two problems ours misses, never the reverse.
    ours = _side([0.1, 0.1], [0.1, 0.1, 0.1, 0.1])
    trl = _side([0.1, 0.1], [1.0, 1.0, 0.1, 0.1])
    assert not reward_comparison(ours, trl)[0]
    assert reward_comparison(trl, ours)[0]  # better is fine


def test_report_only_writes_the_sides_the_ratios_and_the_verdict_as_json(tmp_path, capsys):
    spec = {
        "model": "smollm2-135m-instruct",
        "steps": 4,
        "prompts_per_step": 2,
        "group_size": 2,
        "max_new_tokens": 8,
        "temperature": 1.0,
    }
    spec |= {
        "lr": 1e-4,
        "lora": False,
        "threads": 2,
        "seed": 0,
        "train_problems": [[1, 2]],
        "eval_problems": [],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "init_eval.json").write_text(json.dumps({"reward": 0.1, "accuracy": 0.0}))

    def side(train_s, rewards):
        return {
            "train_time_s": train_s, "samples": 16, "completion_tokens": 64, "prompt_tokens": 128,
            "step_times_s": [train_s / 4] * 4, "step_rewards": rewards,
            "eval": {"reward": 0.2, "accuracy": 0.1, "scores": [0.1, 0.3]}, "load": 1.5,
        }  # fmt: skip

    (tmp_path / "ours_0.json").write_text(json.dumps(side(10.0, [0.1, 0.2, 0.3, 0.4])))
    (tmp_path / "trl_0.json").write_text(json.dumps(side(20.0, [0.1, 0.2, 0.3, 0.4])))
    bf16 = side(5.0, [0.3, 0.4, 0.5, 0.6]) | {"generation_s": [0.5] * 4, "precision": "bf16"}
    bf16["observed"] = {"generation": {"compute": ["bfloat16"], "weights": ["bfloat16"]}}
    (tmp_path / "trl_bf16_0.json").write_text(json.dumps(bf16))  # not one of trl_*'s runs
    (tmp_path / "trl_bf16_1.json").write_text(json.dumps(bf16 | {"train_time_s": 50.0}))  # slower: not shown
    (tmp_path / "notes_0.json").write_text("not a side")
    path = tmp_path / "out.json"
    assert trainer.main(["--report-only", "--out", str(tmp_path), "--json", str(path), "--model", "m"]) == 0
    doc = json.loads(path.read_text())
    assert doc["bench"] == "trainer" and "train_problems" not in doc["spec"] and doc["spec"]["steps"] == 4
    assert [s["side"] for s in doc["sides"]] == ["ours", "trl", "trl_bf16"]
    c, cb = doc["comparisons"]["trl"], doc["comparisons"]["trl_bf16"]
    assert c["samples_per_s_ratio"] == pytest.approx(2.0) and c["reward_ok"] and c["target_ratio"] == 3.0
    assert not c["met"]  # 2x < 3x
    assert cb["samples_per_s_ratio"] == pytest.approx(0.5) and not cb["reward_ok"] and not cb["met"]
    assert doc["sides"][2]["median_generation_s"] == 0.5 and doc["sides"][2]["median_update_s"] == 0.75
    assert len(doc["loadavg_after"]) == 3
    printed = capsys.readouterr().out
    assert "model smollm2-135m-instruct," in printed  # the run's, not --model's
    assert (
        "rollout.engine hf and rollout.dtype float32, update in float32" in printed
    )  # an older spec: the recorded defaults
    assert "ours / trl: samples/s 2.00x" in printed and "NOT met (66.7% of the ratio)" in printed
    assert "ours / trl_bf16: samples/s 0.50x" in printed and "(LOWER)" in printed
    table = (tmp_path / "table.md").read_text().splitlines()  # a Markdown table, as printed
    assert (
        table[0].startswith("| side | train s | samples/s |") and "| reward last 1 of 4 steps |" in table[0]
    )
    assert "| median generation s | median update s |" in table[0]
    assert table[1] == "|---|" + "---:|" * 13 and table[2].startswith("| ours | 10.0 | 1.60 | 6.4 | 19.2 |")
    assert table[3].startswith("| trl | 20.0 | 0.80 |") and "| 5.00 | nan | nan |" in table[3]
    assert table[4].startswith("| trl_bf16 | 5.0 | 3.20 |") and table[5].endswith("| 0.100 (0.00) |  |")
    assert "- trl: TRL precision fp32; step 1 computed: not recorded" in table
    assert (
        "- trl_bf16: TRL precision bf16; step 1 computed: generation in bfloat16 (weights bfloat16)" in table
    )
    assert all(line in printed for line in table)


def test_report_only_without_an_earlier_run_says_so_and_creates_nothing(tmp_path):
    missing = tmp_path / "nothing"
    with pytest.raises(
        SystemExit, match=r"--report-only: no earlier run in .*nothing \(its spec.json is missing\)"
    ):
        trainer.main(["--report-only", "--out", str(missing)])
    assert not missing.exists()
    (tmp_path / "spec.json").write_text(json.dumps({"steps": 4}))
    with pytest.raises(SystemExit, match=r"no init_eval.json in .*before the untrained model was evaluated"):
        trainer.main(["--report-only", "--out", str(tmp_path)])  # an interrupted run's folder
    (tmp_path / "init_eval.json").write_text(json.dumps({"reward": 0.1, "accuracy": 0.0}))
    with pytest.raises(SystemExit, match=r"no side results in .*ours_\*.json, trl_\*.json, trl_bf16_\*.json"):
        trainer.main(["--report-only", "--out", str(tmp_path)])
    (tmp_path / "ours_0.json").write_text(json.dumps({"steps": []}))
    with pytest.raises(SystemExit, match=r"ours_0.json is not a side result of this bench"):
        trainer.main(["--report-only", "--out", str(tmp_path)])


def test_report_only_refuses_a_side_file_from_a_run_with_other_settings(tmp_path):
    """Each side result records its run's settings (spec_digest, without the folder's own model_dir), so a file
    copied in from another run folder is accepted only when that run had the same settings."""
    from benchmarks.trainer.sides import spec_digest

    spec = {"model": "m", "model_dir": "/a/init_model", "steps": 4, "prompts_per_step": 2, "group_size": 2,
            "max_new_tokens": 8, "temperature": 1.0, "lr": 1e-4, "lora": False, "threads": 2, "seed": 0}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "init_eval.json").write_text(json.dumps({"reward": 0.1, "accuracy": 0.0}))
    side = {"train_time_s": 10.0, "samples": 16, "completion_tokens": 64, "prompt_tokens": 128,
            "step_times_s": [2.5] * 4, "step_rewards": [0.1] * 4, "eval": {"reward": 0.2, "accuracy": 0.1}}  # fmt: skip
    same = spec_digest(spec | {"model_dir": "/b/init_model"})  # another folder, same settings
    (tmp_path / "ours_0.json").write_text(json.dumps(side | {"spec_digest": same}))
    assert trainer.main(["--report-only", "--out", str(tmp_path)]) == 0
    other = spec_digest(spec | {"steps": 8})
    (tmp_path / "ours_1.json").write_text(json.dumps(side | {"spec_digest": other}))
    with pytest.raises(SystemExit, match=r"ours_1.json was run with other settings than .*spec.json"):
        trainer.main(["--report-only", "--out", str(tmp_path)])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sides", "ours", "ours"], "names a side twice"),
        (["--train-dtype", "bfloat16", "--sides", "trl"], "--train-dtype set\\(s\\) only our side"),
        (["--engine", "hf_static", "--dtype", "bfloat16", "--sides", "trl_bf16"], "--engine --dtype set"),
        (
            ["--max-new-tokens", "100000"],
            "--max-new-tokens 100000: the longest prompt \\(\\d+ tokens\\) plus "
            "100000 is \\d+ tokens, beyond the 2048 positions of tiny-llama",
        ),
    ],
)
def test_arguments_a_run_could_not_honour_are_refused_before_anything_loads(
    tmp_path, monkeypatch, args, message
):
    def no_load(*a, **k):
        raise AssertionError("a model or the TRL venv was prepared")

    monkeypatch.setattr(cli, "prepare_model", no_load)
    monkeypatch.setattr(cli, "ensure_trl_venv", no_load)
    (tmp_path / "ours_0.json").write_text("{}")  # an earlier run's result
    with pytest.raises(SystemExit, match=message):
        trainer.main([*args, "--out", str(tmp_path)])
    assert (tmp_path / "ours_0.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "argument --steps: must be an integer >= 1, got 0"),
        (["--prompts", "-1"], "argument --prompts: must be an integer >= 1, got -1"),
        (["--group", "1"], "argument --group: must be an integer >= 2, got 1"),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be an integer >= 1, got 0"),
        (["--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
        (["--eval-problems", "0"], "argument --eval-problems: must be an integer >= 1, got 0"),
        (["--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
        (["--temperature", "0"], "argument --temperature: must be a finite number > 0, got 0.0"),
        (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    ],
)
def test_counts_and_rates_are_refused_by_the_shared_argparse_types(tmp_path, capsys, args, message):
    """The counts, ``--group`` and the rates are read by benchmarks.report's types, as the other benches' flags:
    refused while parsing (exit 2, the usage line), naming the flag and the value, before anything loads."""
    (tmp_path / "ours_0.json").write_text("{}")  # an earlier run's result
    with pytest.raises(SystemExit) as info:
        trainer.main([*args, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"marti bench trainer: error: {message}" in err
    assert (tmp_path / "ours_0.json").is_file()


def test_a_json_path_whose_folder_is_missing_is_refused_by_the_shared_check(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        trainer.main(["--json", "/nonexistent_dir/x.json", "--out", str(tmp_path)])
    assert info.value.code == 2 and "--json /nonexistent_dir/x.json: the folder" in capsys.readouterr().err


def test_a_model_that_is_not_found_leaves_the_earlier_results(tmp_path, monkeypatch):
    from marti.errors import NotFoundError

    def no_venv(*a, **k):
        raise AssertionError("the TRL venv was prepared")

    monkeypatch.setattr(cli, "ensure_trl_venv", no_venv)
    (tmp_path / "ours_0.json").write_text("{}")
    with pytest.raises(NotFoundError, match="nosuchmodel"):
        trainer.main(["--model", "nosuchmodel", "--sides", "ours", "--out", str(tmp_path)])
    assert (tmp_path / "ours_0.json").is_file()


def test_a_trl_venv_that_cannot_be_made_leaves_the_earlier_results(tmp_path, monkeypatch):
    """docs/benchmarks.md: old side files go only once the TRL virtualenv is ready, as once the model is found."""

    def broken_venv(*a, **k):
        raise RuntimeError("pip install trl failed")

    def no_model(*a, **k):
        raise AssertionError("the model was prepared")

    monkeypatch.setattr(cli, "ensure_trl_venv", broken_venv)
    monkeypatch.setattr(cli, "prepare_model", no_model)
    (tmp_path / "trl_0.json").write_text("{}")
    with pytest.raises(RuntimeError, match="pip install trl failed"):
        trainer.main(["--sides", "ours", "trl", "--out", str(tmp_path)])
    assert (tmp_path / "trl_0.json").is_file()


def test_the_probe_sees_what_each_phase_computed_in_and_stops():
    layer = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)
    probe = DtypeProbe()
    layer(x)  # outside any phase: not recorded
    with probe.phase("update"), torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
    with probe.phase("generation"):
        layer.to(torch.bfloat16)(x.bfloat16())
    probe.stop()
    with probe.phase("generation"):
        layer.float()(x)  # after stop: not recorded
    probe.stop()  # idempotent
    assert probe.report() == {
        "generation": {"compute": ["bfloat16"], "weights": ["bfloat16"]},
        "update": {"compute": ["bfloat16"], "weights": ["float32"]},
    }


def test_defaults_are_the_recorded_settings_and_bf16_adds_the_trl_bf16_arm():
    spec = {"prompts_per_step": 2, "group_size": 4, "lora": False, "steps": 2, "lr": 1e-4, "seed": 0}
    spec |= {"model_dir": "m", "clip_eps": 0.2, "max_new_tokens": 4, "temperature": 1.0, "grad_clip": 1.0}
    rollout = ours.worker_config(spec)["rollout"]  # an older spec.json: no rollout keys
    assert (rollout["engine"], rollout["dtype"]) == ("hf", "float32")
    assert ours.worker_config(spec)["strategy"]["bf16"] is False
    rollout = ours.worker_config(spec | {"rollout_engine": "hf_static", "rollout_dtype": "bfloat16"})[
        "rollout"
    ]
    assert (rollout["engine"], rollout["dtype"]) == ("hf_static", "bfloat16")
    assert cli.default_sides("float32") == ["ours", "trl"]
    assert cli.default_sides("bfloat16") == ["ours", "trl", "trl_bf16"]
    assert cli.default_sides("float32", "bfloat16") == ["ours", "trl", "trl_bf16"]
    assert ("trl_bf16" in cli.default_sides("auto")) == cpu_has_bf16()
    with pytest.raises(SystemExit):
        trainer.main(["--dtype", "float16"])  # not a choice


def test_our_engine_dtype_and_train_dtype_are_applied_in_a_real_run(tmp_path):
    # A real (tiny) run of our side in its own process: the worker's engine class and the dtypes its
    # generation and update computed in are observed, not read back from the flags.
    out = tmp_path / "run"
    argv = ["--sides", "ours", "--steps", "1", "--prompts", "1", "--group", "2", "--max-new-tokens", "2"]
    argv += ["--eval-problems", "1", "--engine", "hf_static", "--dtype", "bfloat16", "--out", str(out)]
    argv += ["--train-dtype", "bfloat16"]
    assert trainer.main(argv) == 0
    res = json.loads((out / "ours_0.json").read_text())
    assert res["rollout"] == {"engine": "StaticCacheRolloutEngine", "dtype": "bfloat16"}
    assert res["observed"] == {
        "generation": {"compute": ["bfloat16"], "weights": ["bfloat16"]},
        "update": {"compute": ["bfloat16"], "weights": ["float32"]},  # autocast over float32 weights
    }
    assert len(res["generation_s"]) == len(res["step_times_s"]) == 1
    assert res["generation_s"][0] < res["step_times_s"][0]
    assert "generation in bfloat16 (weights bfloat16)" in (out / "table.md").read_text()
    # Every step's CPU per thread, per phase: generation is worker.generate, the update the rest of the step.
    gen, upd = res["threads"]["generation"], res["threads"]["update"]
    assert set(res["threads"]) == {"generation", "update"} and gen["entries"] == upd["entries"] == 1
    assert gen["wall_s"] == pytest.approx(res["generation_s"][0], abs=0.05)
    assert gen["wall_s"] + upd["wall_s"] <= res["step_times_s"][0]
    assert gen["cpu_s"] > 0 and upd["cpu_s"] > 0 and upd["top"][0]["cpu_s"] > 0
    assert "| ours | generation |" in (out / "table.md").read_text()


def test_the_trl_runner_gives_trls_head_the_same_dense_input_as_ours():
    """The TRL virtualenv runs trl_runner.py by path: it finds dense_head from the repository root and calls it on
    the model it loads (a PyTorch workaround both sides get; see the runner's docstring)."""
    import importlib.util
    import inspect

    from services.trainer.models import dense_head

    path = cli.ROOT / "benchmarks" / "trainer" / "trl_runner.py"
    spec = importlib.util.spec_from_file_location("trl_runner_under_test", path)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    assert runner.dense_head_input is dense_head.dense_head_input
    source = inspect.getsource(runner.main)
    assert source.index("dense_head_input(model)") > source.index("AutoModelForCausalLM.from_pretrained(")


def test_the_probe_sees_generation_products_made_without_a_linear_layer():
    """The rollout engine's lean forward multiplies with fused (float32) or packed (bf16) weights, not modules."""
    from services.trainer.models.loading import build_tiny_model, load_tokenizer
    from services.trainer.rollout.engines.lean import LeanCausalLM
    from services.trainer.rollout.engines.static import _preallocated_cache

    tok = load_tokenizer("tiny-llama")
    ids, mask, positions = (
        torch.tensor([[1, 5, 9]]),
        torch.ones(1, 3, dtype=torch.long),
        torch.arange(3)[None],
    )
    for dtype in ("float32", "bfloat16"):
        model = build_tiny_model(tok, seed=0).to(getattr(torch, dtype))
        lean = LeanCausalLM(model)
        probe = DtypeProbe()
        with probe.phase("update"):  # outside generation: bare products are not the model's forward
            lean(ids, mask, positions, _preallocated_cache(model, 3))
        assert probe.report() == {}
        with probe.phase("generation"):
            lean(ids, mask, positions, _preallocated_cache(model, 3))
        probe.stop()
        assert probe.report() == {"generation": {"compute": [dtype], "weights": [dtype]}}


def test_the_probe_sees_bare_products_in_its_own_thread_only():
    """Dispatch modes are thread-local: a product made in another thread's generation phase goes unrecorded."""
    import threading

    probe = DtypeProbe()
    weight = torch.randn(4, 4)

    def generate() -> None:
        with probe.phase("generation"):
            torch.mm(torch.randn(2, 4), weight)

    other = threading.Thread(target=generate)
    other.start()
    other.join()
    assert probe.report() == {}
    generate()
    probe.stop()
    assert probe.report() == {"generation": {"compute": ["float32"], "weights": ["float32"]}}


def test_the_probe_files_the_updates_forward_products_and_the_weights_the_caller_names():
    """The update's lean training forward multiplies cast copies of the weights without linear layers: its products
    are filed by output dtype only (forward ones: made with gradients recorded), the weights by record_weights."""

    class _Float64Backward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            torch.mm(grad.double(), grad.double().t())  # a backward product: not the forward's
            return grad

    probe = DtypeProbe()
    weight = torch.randn(4, 4, requires_grad=True)
    with probe.phase("update"):
        with torch.no_grad():
            torch.mm(
                torch.randn(2, 4).double(), weight.detach().double()
            )  # a weight merge: not the forward's
        out = torch.mm(_Float64Backward.apply(torch.randn(2, 4)).bfloat16(), weight.bfloat16())
        out.float().sum().backward()
    assert probe.report() == {"update": {"compute": ["bfloat16"], "weights": []}}
    with probe.phase("update"):
        probe.record_weights(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    probe.record_weights(torch.nn.Linear(2, 2).double())  # outside any phase: not recorded
    probe.stop()
    assert probe.report() == {"update": {"compute": ["bfloat16"], "weights": ["float32"]}}
