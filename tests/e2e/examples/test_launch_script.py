"""The design's launch script (``examples/design/train_multi_agent.sh``) runs with ``marti train``.

Its ``--dataset "json:data/multi_agent_resource_allocation.json"`` is written first, in the script's working
directory, by ``scripts/data/make_allocation_data.py --kind resource_allocation`` (the repository makes the file),
and its ``--reward_model`` (``tiny-llama`` in the copy: a tiny random one-label classifier on its own Ray actor)
scores the episodes: neither is ignored.

A copy is made at test time with three edits only: the 7B model names become the local ``tiny-llama``,
``python -m openrlhf.cli.train_ppo_ray`` becomes ``marti train``, and the sizes are turned down so it finishes
in about a minute of training (MAX_STEPS=2, micro batch 2, no accumulation, rollout batch 4 episodes,
1 PPO epoch, 1 epoch, 8 new tokens, 3 env turns: one per agent; the ``numeric`` verifier, as the data's
``answer`` is a number). Every other flag stays as written (ZeRO-3, bf16, flash
attention, vLLM engines, wandb, ...): the ones that do not apply here must be reported once and ignored.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marti.command.launch_flags import MachineInfo

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "design" / "train_multi_agent.sh"
OUT_DIR = "multi_agent_resource_allocation_results"
DATA = "data/multi_agent_resource_allocation.json"
"""The script's ``--dataset json:...`` file, relative to its working directory."""
MAKE_DATA = ROOT / "scripts" / "data" / "make_allocation_data.py"

#: Variable -> value in the copy.
VARIABLES = {"MAX_STEPS": "2", "MICRO_BATCH_SIZE": "2", "GRADIENT_ACCUMULATION_STEPS": "1"}
#: Literal flag values in the script -> value in the copy.
LITERALS = {"--rollout_batch_size 1024": "--rollout_batch_size 4", "--ppo_epochs 4": "--ppo_epochs 1"}
LITERALS["--max_epochs 3"] = "--max_epochs 1"
#: Appended to the command: shorter generations and episodes (a launch flag and a marti override), and the
#: dataset_task env's numeric verifier (an env option; no launch flag names it).
APPENDED = "--generate_max_len 8 --set environment.max_turns=3 --set environment.options.verifier=numeric"


def scaled_copy(text: str) -> str:
    """The launch script with local models, ``marti train`` and small sizes (see the module docstring).

    Raises:
        AssertionError: The script no longer has a line or value this edit expects (so it must be revisited).
    """
    text, n = re.subn(r'^(\w+_AGENT_MODEL)="[^"]*"', r'\1="tiny-llama"', text, flags=re.M)
    assert n == 3, "expected three *_AGENT_MODEL variables"
    assert text.count("python -m openrlhf.cli.train_ppo_ray") == 1
    text = text.replace("python -m openrlhf.cli.train_ppo_ray", "marti train")
    for var, value in VARIABLES.items():
        text, n = re.subn(rf"^{var}=.*$", f"{var}={value}", text, flags=re.M)
        assert n == 1, var
    for old, new in LITERALS.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("--wandb_run_name") and not last.endswith("\\"), last
    return text.rstrip() + f" \\\n{APPENDED}\n"


def expected_notes(machine: MachineInfo) -> set[str]:
    """Launch flags of the script that cannot apply on ``machine`` (each must be reported exactly once)."""
    notes = set()  # --dataset and --reward_model take effect (the dataset: and reward: sections)
    if not machine.has_cuda:
        notes |= {"actor_init_on_gpu", "offload_reference_model", "use_flash_attn"}
        notes |= {"vllm_num_engines", "vllm_tensor_parallel_size", "enable_prefix_caching"}
    elif not machine.flash_attn_installed:
        notes.add("use_flash_attn")
    if not machine.bf16_supported:
        notes.add("bf16")
    if not machine.wandb_installed:
        notes.add("log_with")
    return notes


def test_scaled_copy_keeps_every_other_line():
    original = SCRIPT.read_text()
    copy = scaled_copy(original)
    changed = [(a, b) for a, b in zip(original.splitlines(), copy.splitlines(), strict=False) if a != b]
    assert len(changed) == 3 + 1 + len(VARIABLES) + len(LITERALS) + 1, changed  # models, command, sizes, last
    assert "openrlhf" not in copy and "7b" not in copy.lower()


@pytest.mark.slow
def test_launch_script_runs_with_marti_train(tmp_path):
    script = tmp_path / "train_multi_agent.sh"
    script.write_text(scaled_copy(SCRIPT.read_text()))
    made = subprocess.run(
        [sys.executable, str(MAKE_DATA), "--kind", "resource_allocation", "--out", DATA],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    rows = json.loads((tmp_path / DATA).read_text())
    assert rows and all(set(r) >= {"prompt", "answer"} and float(r["answer"]) >= 0 for r in rows)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's `marti`
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]

    notes = re.findall(r"^note: --(\w+) ignored: ", proc.stderr, flags=re.M)
    assert sorted(notes) == sorted(expected_notes(MachineInfo.detect())), proc.stderr[-3000:]

    run = tmp_path / OUT_DIR  # --output_dir, relative to the script's working directory
    assert (run / "report.md").exists()
    # what rollout.engine / rollout.dtype resolved to: in the job's log, its start record and report.md
    said = re.search(r"rollout: engine (\w+), dtype (\w+) \(rollout.engine=", proc.stdout + proc.stderr)
    assert said, proc.stderr[-3000:]
    recorded = json.loads((run / "config_history.jsonl").read_text().splitlines()[-1])["rollout"]
    assert recorded == {"engine": said.group(1), "dtype": said.group(2)}
    assert f"- Rollout: engine {said.group(1)}, dtype {said.group(2)}\n" in (run / "report.md").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # --logging_steps 10 (output.log_every) with MAX_STEPS=2: no multiple of 10 is reached, the final step is kept
    assert [r["step"] for r in records] == [2]
    for agent in ("agent_1", "agent_2", "agent_3"):  # --num_agents 3, one model each
        assert f"{agent}/reward" in records[-1]["metrics"]
        assert f"{agent}/policy_loss" in records[-1]["metrics"]
        assert (
            f"{agent}/value_loss" in records[-1]["metrics"]
        )  # no YAML: OpenRLHF's default gae, with critics

    cfg = yaml.safe_load((run / "config.yaml").read_text())  # the flags landed in the config
    assert cfg["num_agents"] == 3 and cfg["max_steps"] == 2 and cfg["seed"] == 42
    assert [a["pretrain_model"] for a in cfg["agents"]] == ["tiny-llama"] * 3
    assert cfg["learning_rate"] == pytest.approx(2e-5)
    assert cfg["micro_train_batch_size"] == 2 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["strategy"]["name"] == "deepspeed" and cfg["strategy"]["zero_stage"] == 3
    assert cfg["strategy"]["critic_zero_stage"] == 3 and cfg["policy"]["disable_dropout"] is True
    assert cfg["output"]["log_every"] == 10
    assert [a["ref_model"] for a in cfg["agents"]] == ["tiny-llama"] * 3  # --ref_model: one for all agents
    assert cfg["algorithm"]["ppo_epochs"] == 1 and cfg["rollout"]["episodes_per_step"] == 4
    assert cfg["output"]["wandb_run_name"] == "multi_agent_exp_42"
    assert cfg["algorithm"]["advantage_estimator"] == "gae" and cfg["algorithm"]["use_kl_loss"] is False
    assert "no config file: OpenRLHF's defaults apply" in proc.stderr

    # --dataset: the rows were played by the dataset_task env, scored by its numeric verifier
    assert cfg["dataset"]["path"] == f"json:{DATA}" and cfg["environment"]["env_name"] == "dataset_task"
    assert cfg["environment"]["options"]["verifier"] == "numeric"
    metrics = records[-1]["metrics"]
    assert 0.0 <= metrics["team/task_completion"] <= 1.0
    # --reward_model: the reward model's scores replaced the verifier's. Verifier returns are 0, 0.5 or 1 per
    # episode (half team, half own answer), so 4 episodes average to multiples of 1/8; a random classifier's
    # scores do not.
    assert cfg["reward"]["model"] == "tiny-llama"
    rewards = [metrics[f"agent_{i}/reward"] for i in (1, 2, 3)]
    assert any(abs(r * 8 - round(r * 8)) > 1e-6 for r in rewards), rewards
