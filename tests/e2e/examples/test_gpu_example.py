"""examples/resource_allocation_gpu.yaml, the GPU main job: it validates as written (one GPU, three LoRA agents on
one base, bf16, evaluations every 10 steps, a wall-time budget), and the same job runs one step on the CPU with
``--set device=cpu --set strategy.bf16=false`` (fewer episodes, evaluation episodes and tokens)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from marti.config import load_config

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "resource_allocation_gpu.yaml"
pytestmark = pytest.mark.slow
AGENTS = ("agent_1", "agent_2", "agent_3")


def test_gpu_example_validates_as_the_one_gpu_bf16_lora_job():
    cfg = load_config(EXAMPLE)
    assert cfg.device == "cuda" and cfg.strategy.bf16 and cfg.strategy.name == "torch"
    assert cfg.policy.mode == "lora" and cfg.policy_mode == "lora"
    assert [a.name for a in cfg.agents] == list(AGENTS)
    assert {a.pretrain_model for a in cfg.agents} == {"smollm2-135m-instruct"}
    assert max(a.num_gpus for a in cfg.agents) == 1  # the team's one policy actor reserves one GPU
    assert cfg.rollout.engine == "hf" and cfg.rollout.eval_every == 10
    assert cfg.budget.max_wall_time_s == 480
    cpu = load_config(EXAMPLE, ["device=cpu", "strategy.bf16=false"])
    assert cpu.device == "cpu" and not cpu.strategy.bf16


def test_gpu_example_runs_one_step_on_the_cpu(tmp_path):
    run = tmp_path / "run"
    sets = [
        "device=cpu",
        "strategy.bf16=false",
        "max_steps=1",
        "rollout.episodes_per_step=4",  # one group of 4
        "rollout.eval_episodes=1",
        "rollout.max_new_tokens=4",
        f"output.dir={run}",
    ]
    cmd = [sys.executable, "-m", "marti.command.main", "train", str(EXAMPLE), "--no-progress"]
    cmd += [arg for s in sets for arg in ("--set", s)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1]
    metrics = records[0]["metrics"]
    for agent in AGENTS:
        assert math.isfinite(metrics[f"{agent}/policy_loss"]), agent
        assert metrics[f"{agent}/num_samples"] == 4, agent
    evals = [json.loads(line)["step"] for line in (run / "eval.jsonl").read_text().splitlines()]
    assert evals == [0, 1]  # before training and after the last step
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert (run / "report.md").read_text().startswith("# Run report: resource_allocation_gpu")
