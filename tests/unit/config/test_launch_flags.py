"""Unit tests of marti.command.launch_flags: OpenRLHF-style flags onto the training config."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from marti.command.launch_flags import FLAG_TABLE, MachineInfo, build_config, parse_launch_flags
from marti.config import load_config
from marti.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[3]
DESIGN = ROOT / "examples" / "design"
EXAMPLE = ROOT / "examples" / "resource_allocation.yaml"
CPU = MachineInfo()
GPU = MachineInfo(has_cuda=True, bf16_supported=True, flash_attn_installed=True, wandb_installed=True)
REQUIRED = (
    "actor_model critic_model ref_model reward_model dataset num_agents max_steps micro_train_batch_size "
    "gradient_accumulation_steps ppo_epochs learning_rate actor_learning_rate critic_learning_rate "
    "num_warmup_steps seed rollout_batch_size max_epochs normalize_reward actor_init_on_gpu enable_ema bf16 "
    "actor_zero_stage critic_zero_stage offload_reference_model disable_actor_dropout vllm_num_engines "
    "vllm_tensor_parallel_size enable_prefix_caching use_flash_attn output_dir logging_steps save_steps "
    "log_with wandb_project wandb_run_name"
).split()


def script_argv() -> list[str]:
    """The flags of the design's train_multi_agent.sh, with its shell variables expanded."""
    text = (DESIGN / "train_multi_agent.sh").read_text()
    env = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', text, re.M))
    cmd = text.split("train_ppo_ray", 1)[1].replace("\\\n", " ")
    for key in sorted(env, key=len, reverse=True):
        cmd = cmd.replace("$" + key, env[key])
    return shlex.split(cmd)


DESIGN_DATA = "data/multi_agent_resource_allocation.json"
"""The file the design script's ``--dataset json:...`` names, relative to the directory it runs in."""
DATA_ENV = ["environment.env_name=dataset_task"]
"""The design YAML names the scenario env; with the script's ``--dataset`` the rows play in ``dataset_task``."""


@pytest.fixture
def design_workdir(tmp_path, monkeypatch):
    """Run in a directory holding the design script's data file (``--dataset`` paths are relative to it)."""
    (tmp_path / "data").mkdir()
    (tmp_path / DESIGN_DATA).write_text(json.dumps([{"prompt": "Plan the work.", "answer": "task_1: 2"}]))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_documented_flag_is_known():
    assert not [f for f in REQUIRED if f not in FLAG_TABLE]


def test_design_script_on_cpu(design_workdir):
    cfg, warnings = build_config(
        DESIGN / "multi_agent_collaboration.yaml", DATA_ENV, script_argv(), machine=CPU
    )
    ignored = sorted(w.split()[0] for w in warnings if " ignored: " in w)
    assert ignored == sorted(
        [
            "--actor_init_on_gpu",
            "--bf16",
            "--offload_reference_model",
            "--use_flash_attn",
            "--log_with",
            "--vllm_num_engines",
            "--vllm_tensor_parallel_size",
            "--enable_prefix_caching",
            "--critic_model",  # the design YAML's estimator is grpo: no critic
            "--critic_learning_rate",
            "--critic_zero_stage",
        ]
    )
    assert [a.pretrain_model for a in cfg.agents] == [
        "meta-llama/Llama-2-7b-chat-hf",
        "mistralai/Mistral-7B-Instruct-v0.1",
        "THUDM/chatglm3-6b",
    ]
    assert {a.critic_model for a in cfg.agents} == {None} and cfg.algorithm.advantage_estimator == "grpo"
    assert all(a.ref_model == "meta-llama/Llama-2-7b-chat-hf" for a in cfg.agents)
    assert (
        cfg.max_steps == 100000 and cfg.micro_train_batch_size == 16 and cfg.gradient_accumulation_steps == 4
    )
    assert cfg.algorithm.ppo_epochs == 4 and cfg.max_epochs == 3 and cfg.lr_warmup_steps == 5000
    assert cfg.learning_rate == pytest.approx(2e-5) and cfg.algorithm.critic_learning_rate is None
    assert cfg.rollout.episodes_per_step == 1024 and cfg.algorithm.normalize_reward
    assert cfg.policy.ema and cfg.policy.disable_dropout
    assert (
        cfg.strategy.name == "deepspeed"
        and cfg.strategy.zero_stage == 3
        and cfg.strategy.critic_zero_stage is None
    )
    assert not cfg.strategy.bf16 and not cfg.strategy.init_on_gpu and cfg.policy.attn_implementation is None
    assert not cfg.vllm.enable_prefix_caching  # vLLM flags are CUDA only: the YAML's vllm section stays
    assert cfg.output.dir == "./multi_agent_resource_allocation_results"
    assert cfg.output.log_every == 10 and cfg.output.save_every == 1000
    assert cfg.output.log_with == ["tensorboard"]
    assert cfg.output.wandb_project == "multi_agent_resource_allocation"
    assert cfg.output.wandb_run_name == "multi_agent_exp_42"
    assert cfg.dataset.path == f"json:{DESIGN_DATA}" and cfg.dataset.seed == 42  # --dataset takes effect
    assert cfg.reward.model == "meta-llama/Llama-2-7b-chat-hf"  # --reward_model takes effect


def test_design_script_on_a_gpu_machine_applies_gpu_flags(design_workdir):
    cfg, warnings = build_config(
        DESIGN / "multi_agent_collaboration.yaml", DATA_ENV, script_argv(), machine=GPU
    )
    assert [w for w in warnings if " ignored: " in w and "trains no critic" not in w] == []
    assert cfg.strategy.bf16 and cfg.strategy.init_on_gpu and cfg.strategy.offload_reference_model
    assert cfg.policy.attn_implementation == "flash_attention_2" and cfg.output.log_with == ["wandb"]
    assert cfg.vllm.num_engines == 3 and cfg.vllm.enable_prefix_caching


def test_flags_without_a_config_file_build_the_team(design_workdir):
    cfg, _ = build_config(None, ["max_steps=2"], script_argv(), machine=CPU)
    assert [(a.name, a.role) for a in cfg.agents] == [
        ("agent_1", "planner"),
        ("agent_2", "executor"),
        ("agent_3", "evaluator"),
    ]
    assert cfg.max_steps == 2  # --set wins over the flag


def test_data_flags_set_the_dataset_section(design_workdir):
    (design_workdir / "data" / "held.jsonl").write_text('{"question": "q", "solution": "s"}\n')
    argv = ["--prompt_data", DESIGN_DATA, "--input_key", "question", "--label_key", "solution"]
    argv += ["--eval_dataset", "jsonl:data/held.jsonl", "--max_samples", "64", "--seed", "9"]
    team = design_workdir / "team.yaml"
    team.write_text("training_name: t\nagents: [{name: a, pretrain_model: m, role: solver}]\n")
    cfg, warnings = build_config(team, [], argv, machine=CPU)
    assert not warnings
    d = cfg.dataset
    assert (d.path, d.input_key, d.label_key) == (DESIGN_DATA, "question", "solution")
    assert (d.eval_path, d.max_samples, d.seed) == ("jsonl:data/held.jsonl", 64, 9)
    cfg, _ = build_config(team, ["dataset.max_samples=2"], ["--dataset", f"json:{DESIGN_DATA}"], machine=CPU)
    assert cfg.dataset.path == f"json:{DESIGN_DATA}" and cfg.dataset.max_samples == 2  # --set wins


def test_reward_flags_set_the_reward_section(design_workdir):
    team = design_workdir / "team.yaml"
    team.write_text("training_name: t\nagents: [{name: a, pretrain_model: m, role: solver}]\n")
    data = ["--dataset", f"json:{DESIGN_DATA}"]
    for flag in ("--reward_model", "--reward_pretrain"):  # OpenRLHF's two names
        cfg, warnings = build_config(team, [], [*data, flag, "rm/folder"], machine=CPU)
        assert cfg.reward.model == "rm/folder" and cfg.reward.active and not warnings
    cfg, _ = build_config(
        team, [], [*data, "--remote_rm_url", "http://127.0.0.1:5000/get_reward"], machine=CPU
    )
    assert cfg.reward.remote_url == "http://127.0.0.1:5000/get_reward" and cfg.reward.model is None
    cfg, _ = build_config(team, ["reward.model=tiny-llama"], [*data, "--reward_model", "x"], machine=CPU)
    assert cfg.reward.model == "tiny-llama"  # --set wins
    with pytest.raises(InvalidArgumentError, match="set dataset.path"):  # a reward model scores dataset rows
        build_config(team, [], ["--reward_model", "rm/folder"], machine=CPU)


def test_design_yaml_with_the_dataset_flag_names_both_the_file_env_and_the_flag(design_workdir):
    """The design YAML names its scenario env: ``--dataset`` does not switch it behind the file's back."""
    with pytest.raises(InvalidArgumentError) as info:
        build_config(DESIGN / "multi_agent_collaboration.yaml", [], script_argv(), machine=CPU)
    text = str(info.value)
    assert "environment.env_name is 'collaborative_task_solving'" in text
    assert f"--dataset json:{DESIGN_DATA} sets dataset.path" in text
    assert "--set environment.env_name=dataset_task" in text
    cfg, _ = build_config(DESIGN / "multi_agent_collaboration.yaml", DATA_ENV, script_argv(), machine=CPU)
    assert cfg.environment.env_name == "dataset_task"  # the override the message names


def test_a_dataset_flag_naming_a_missing_file_is_blamed_on_the_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        InvalidArgumentError,
        match=r"^--dataset json:data/x\.json: 'dataset\.path': dataset JSON file 'data/x\.json' does not exist",
    ):
        build_config(EXAMPLE, [], ["--dataset", "json:data/x.json"], machine=CPU)
    with pytest.raises(InvalidArgumentError, match="--max_samples expects an integer, got 'all'"):
        build_config(EXAMPLE, [], ["--max_samples", "all"], machine=CPU)
    with pytest.raises(InvalidArgumentError, match="missing required key 'dataset.path'"):
        build_config(EXAMPLE, [], ["--input_key", "question"], machine=CPU)


def test_a_flag_is_reported_once():
    flags = parse_launch_flags(["--bf16", "--use_flash_attn", "--bf16"], machine=CPU)
    assert [w.split()[0] for w in flags.warnings] == ["--bf16", "--use_flash_attn"]
    assert not flags.scalar_overrides


def test_one_model_for_all_agents():
    cfg, _ = build_config(EXAMPLE, [], ["--actor_model", "tiny-llama"], machine=CPU)
    assert {a.pretrain_model for a in cfg.agents} == {"tiny-llama"}


def test_model_count_must_match_team():
    with pytest.raises(InvalidArgumentError, match="describe 2 agents but .* lists 3"):
        build_config(EXAMPLE, [], ["--actor_model", "a", "b"], machine=CPU)
    with pytest.raises(InvalidArgumentError, match="--critic_model gives 2 models but the team has 3"):
        build_config(None, [], ["--actor_model", "a", "b", "c", "--critic_model", "x", "y"], machine=CPU)
    with pytest.raises(InvalidArgumentError, match="no --actor_model"):
        build_config(None, [], ["--seed", "1"], machine=CPU)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--actor_modle", "a"], "unknown launch flag --actor_modle (did you mean --actor_model?)"),
        (["--frobnicate"], "unknown launch flag --frobnicate"),
        (["--seed", "x"], "--seed expects an integer, got 'x'"),
        (["--learning_rate", "fast"], "--learning_rate expects a number, got 'fast'"),
        (["--seed"], "--seed takes exactly one value, got 0"),
        (["--seed", "1", "2"], "takes exactly one value, got 2"),
        (["--bf16", "yes-please"], "--bf16 is a switch and takes no value"),
        (["--bf16=maybe"], "must be true or false"),
        (["--actor_model"], "needs at least one model name"),
        (["stray", "--seed", "1"], "unexpected argument 'stray'"),
    ],
)
def test_bad_flags(argv, fragment):
    with pytest.raises(InvalidArgumentError) as info:
        parse_launch_flags(argv, machine=CPU)
    assert fragment in str(info.value)


def test_equals_dashes_and_switch_values():
    flags = parse_launch_flags(["--max-steps=7", "--enable_ema=false", "--normalize_reward"], machine=CPU)
    cfg = load_config(EXAMPLE, flags.overrides(3))
    assert cfg.max_steps == 7 and not cfg.policy.ema and cfg.algorithm.normalize_reward


def test_flag_values_are_validated_by_the_schema():
    with pytest.raises(InvalidArgumentError, match="'strategy.zero_stage'"):
        build_config(EXAMPLE, [], ["--actor_zero_stage", "5"], machine=CPU)
    cfg, _ = build_config(EXAMPLE, [], ["--eps_clip", "0.1", "--n_samples_per_prompt", "2"], machine=CPU)
    assert cfg.algorithm.clip_eps_low == cfg.algorithm.clip_eps_high == 0.1 and cfg.rollout.group_size == 2


def test_string_values_stay_strings():
    cfg, _ = build_config(EXAMPLE, [], ["--wandb_run_name", "null", "--output_dir", "123"], machine=CPU)
    assert cfg.output.wandb_run_name == "null" and cfg.output.dir == "123"


def test_machine_detect_runs():
    from marti.plumbing.cpu_features import cpu_has_bf16

    info = MachineInfo.detect()
    assert isinstance(info.has_cuda, bool) and (info.bf16_supported <= (info.has_cuda or cpu_has_bf16()))


def test_without_a_config_file_the_algorithm_follows_openrlhfs_defaults(design_workdir):
    """The design's script alone (no YAML) trains what OpenRLHF would: PPO (gae) with a critic per agent and the
    KL as a reward penalty, and says so in one note; a flag given wins over the default."""
    cfg, notes = build_config(None, [], script_argv(), machine=CPU)
    algo = cfg.algorithm
    assert algo.advantage_estimator == "gae" and not algo.use_kl_loss and algo.kl_coef == pytest.approx(0.01)
    assert algo.kl_estimator == "k1" and algo.lambd == 1.0 and algo.value_clip == 0.5
    assert cfg.rollout.group_size == 1 and cfg.seed == 42
    assert cfg.learning_rate == pytest.approx(2e-5)  # --actor_learning_rate of the script, not the default
    assert [a.critic_model for a in cfg.agents] == [
        "meta-llama/Llama-2-7b-chat-hf",
        "mistralai/Mistral-7B-Instruct-v0.1",
        "THUDM/chatglm3-6b",
    ]
    (note,) = [n for n in notes if n.startswith("no config file: OpenRLHF's defaults apply")]
    assert "--advantage_estimator gae" in note and "--actor_learning_rate" not in note  # given: not a default
    grpo = ["--advantage_estimator", "group_norm", "--n_samples_per_prompt", "2"]
    cfg, notes = build_config(None, [], [*script_argv(), *grpo], machine=CPU)
    algo = cfg.algorithm
    assert algo.advantage_estimator == "grpo" and {a.critic_model for a in cfg.agents} == {None}
    assert (algo.lambd, algo.value_clip, algo.critic_learning_rate) == (0.95, 0.2, None)  # marti's: no critic
    assert cfg.strategy.critic_zero_stage is None and cfg.strategy.zero_stage == 3  # --actor_zero_stage stays
    (note,) = [n for n in notes if n.startswith("no config file: OpenRLHF's defaults apply")]
    assert "--lambd" not in note and "--value_clip" not in note  # the critic's defaults: gae only
    ignored = [n.split(" ignored: ")[0] for n in notes if "which trains no critic" in n]
    assert ignored == ["--critic_model", "--critic_learning_rate 2e-5", "--critic_zero_stage 3"]
    cfg, _ = build_config(
        None, ["algorithm.advantage_estimator=rloo"], [*script_argv(), grpo[2], "2"], machine=CPU
    )
    assert cfg.algorithm.advantage_estimator == "rloo" and cfg.algorithm.lambd == 0.95  # --set counts too


@pytest.mark.parametrize(
    ("openrlhf", "ours"),
    [
        ("gae", "gae"),
        ("reinforce", "reinforce++"),
        ("reinforce_baseline", "reinforce++_baseline"),
        ("group_norm", "grpo"),
        ("dr_grpo", "dr_grpo"),
        ("rloo", "rloo"),
        ("reinforce++", "reinforce++"),
    ],
)
def test_openrlhfs_estimator_names_are_accepted(openrlhf, ours):
    cfg, _ = build_config(EXAMPLE, [], ["--advantage_estimator", openrlhf], machine=CPU)
    assert cfg.algorithm.advantage_estimator == ours


def test_errors_for_flag_values_name_the_flag_not_the_file():
    with pytest.raises(InvalidArgumentError, match="^--kl_estimator k4: 'algorithm.kl_estimator'") as err:
        build_config(EXAMPLE, [], ["--kl_estimator", "k4"], machine=CPU)
    assert str(EXAMPLE) not in str(err.value)
    with pytest.raises(
        InvalidArgumentError, match="--advantage_estimator nope: unknown estimator.*group_norm"
    ):
        build_config(EXAMPLE, [], ["--advantage_estimator", "nope"], machine=CPU)


def test_critic_flags_without_a_critic_are_noted_and_ignored():
    """The example's estimator is grpo, which trains no critic: the critic's flags are not applied (the config
    would refuse them), with one note; the same flags with gae are applied."""
    argv = ["--critic_model", "tiny-llama", "--lambd", "0.9", "--critic_zero_stage", "2"]
    cfg, notes = build_config(EXAMPLE, [], argv, machine=CPU)
    assert {a.critic_model for a in cfg.agents} == {None} and cfg.algorithm.lambd == 0.95
    assert (
        cfg.strategy.name == "torch" and cfg.strategy.critic_zero_stage is None
    )  # deepspeed came from it alone
    assert [n for n in notes if "trains no critic" in n] == [
        f"{flag} ignored: algorithm.advantage_estimator is grpo, which trains no critic (only gae does, "
        "OpenRLHF's default)"
        for flag in ("--critic_model", "--lambd 0.9", "--critic_zero_stage 2")
    ]
    cfg, notes = build_config(EXAMPLE, [], [*argv, "--advantage_estimator", "gae"], machine=CPU)
    assert {a.critic_model for a in cfg.agents} == {"tiny-llama"} and cfg.algorithm.lambd == 0.9
    assert cfg.strategy.critic_zero_stage == 2 and not [n for n in notes if "trains no critic" in n]
    with pytest.raises(InvalidArgumentError, match=r"agents\.0\.critic_model=m configure the critic"):
        build_config(EXAMPLE, ["agents.0.critic_model=m"], [], machine=CPU)  # a key, not a flag: refused


def test_vllm_flags_without_cuda_are_reported_and_ignored(design_workdir):
    team = design_workdir / "team.yaml"
    team.write_text(
        "training_name: t\nagents: [{name: a, pretrain_model: m, role: solver}]\nrollout: {engine: hf}\n"
    )
    cfg, warnings = build_config(team, [], ["--vllm_num_engines", "2"], machine=CPU)
    assert warnings == [
        "--vllm_num_engines ignored: vLLM needs CUDA; a transformers engine samples here (vllm.* unused)"
    ]
    assert cfg.vllm.num_engines == 1
    cfg, warnings = build_config(team, [], ["--vllm_num_engines", "2"], machine=GPU)
    assert cfg.vllm.num_engines == 2 and not [
        w for w in warnings if " ignored: " in w
    ]  # applied (rollout.engine hf: noted, below)


@pytest.mark.parametrize("flags, honoured", [("fpu avx512f avx512_bf16", True), ("fpu avx512f", False)])
def test_bf16_flag_follows_a_cpu_with_native_bf16(tmp_path, monkeypatch, flags, honoured):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    machine = MachineInfo.detect(cpuinfo)
    assert machine.bf16_supported is honoured
    out = parse_launch_flags(["--bf16"], machine=machine)
    assert (out.scalar_overrides == ["strategy.bf16=true"]) is honoured
    assert bool(out.warnings) is not honoured


def test_vllm_flags_that_a_transformers_engine_would_not_read_are_noted(design_workdir):
    """On a CUDA machine, a vLLM launch flag is applied to ``vllm.*`` but, when the config's ``rollout.engine`` is
    a transformers engine (``hf``, ``hf_static``: from the file or ``--set``), no engine reads it: a note says so.
    With ``vllm`` or ``auto`` (which may pick vLLM) there is none."""
    team = design_workdir / "team.yaml"
    team.write_text(
        "training_name: t\nagents: [{name: a, pretrain_model: m, role: solver}]\nrollout: {engine: hf}\n"
    )
    cfg, notes = build_config(team, [], ["--vllm_num_engines", "2", "--enable_prefix_caching"], machine=GPU)
    assert cfg.vllm.num_engines == 2 and notes == [
        f"{flag} unused: rollout.engine is hf (from {team}), and only the vllm engine (or auto, where it picks "
        "vLLM) reads vllm.*"
        for flag in ("--vllm_num_engines", "--enable_prefix_caching")
    ]
    cfg, notes = build_config(team, ["rollout.engine=hf_static"], ["--vllm_num_engines", "2"], machine=GPU)
    assert len(notes) == 1 and notes[0].startswith(
        "--vllm_num_engines unused: rollout.engine is hf_static (from --set)"
    )
    for engine in ("auto", "vllm"):
        _, notes = build_config(team, [f"rollout.engine={engine}"], ["--vllm_num_engines", "2"], machine=GPU)
        assert not notes


def test_the_machine_is_probed_only_for_a_flag_that_depends_on_it(monkeypatch):
    """Probing imports torch (about 1 s): no flags, or flags that do not depend on the machine, never probe;
    the first flag that does probes once."""
    probes = []
    monkeypatch.setattr(MachineInfo, "detect", classmethod(lambda cls: probes.append(1) or CPU))
    parse_launch_flags([])
    parse_launch_flags(["--seed", "7", "--max_steps", "3"])
    assert probes == []
    flags = parse_launch_flags(["--bf16", "--use_flash_attn", "--seed", "7"])
    assert probes == [1]
    assert any("--bf16 ignored" in w for w in flags.warnings), flags.warnings


def test_a_group_estimator_on_openrlhfs_default_group_size_names_the_flag():
    """No config file: ``--n_samples_per_prompt`` defaults to OpenRLHF's 1, which a group estimator cannot use;
    the refusal names the flag the user did not give (the key alone says nothing to a flags-only user)."""
    argv = ["--actor_model", "tiny-llama", "--advantage_estimator", "group_norm"]
    with pytest.raises(InvalidArgumentError, match=r"(?s)group_size >= 2, got 1.*--n_samples_per_prompt N"):
        build_config(None, [], argv, machine=CPU)
    with pytest.raises(InvalidArgumentError) as err:  # given by the user: the usual message only
        build_config(None, [], [*argv, "--n_samples_per_prompt", "1"], machine=CPU)
    assert "OpenRLHF's default" not in str(err.value)
