"""A reply length (``max_new_tokens``) that leaves no room for a prompt in the model's context is refused by
``marti train`` before the run folder, in any job: a new user's ``--set rollout.max_new_tokens=1000000`` on
examples/tiny.yaml (an env job) started the services and Ray, cleared the run with ``--overwrite`` and failed at
the first episode (``its prompt is too long: prompt 0: 286 tokens + max_new_tokens 1000000 exceeds max_model_len
2048``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.refused_runs import train_over_an_old_run

ROOT = Path(__file__).resolve().parents[4]


def test_a_reply_longer_than_the_models_context_is_refused_before_an_overwrite(tmp_path):
    job = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    job["rollout"]["max_new_tokens"] = 2048
    job["agents"][1]["sampling"] = {"max_new_tokens": 8}  # its own, which fits
    proc = train_over_an_old_run(tmp_path, job)
    assert (
        "marti train: agent 'agent_1' (agents[0]): rollout.max_new_tokens 2048 leaves no room for a prompt in the "
        "2048 tokens the rollout engine takes (max_position_embeddings of agents[0].pretrain_model 'tiny-llama'); "
        "lower rollout.max_new_tokens"
    ) in proc.stderr, proc.stderr
    assert "agent_2" not in proc.stderr
    assert "starting embedded broker" not in proc.stderr + proc.stdout  # nothing started


def test_a_scripted_agents_reply_length_is_not_checked():
    """A scripted agent (workflow.roles[].scripted) replies from Python and generates nothing: its
    max_new_tokens is never asked of a model, so a value past its model's context is no reason to refuse the job
    (check_prompt_lengths skips it too); a model agent's still is."""
    from marti.config import config_from_dict
    from marti.errors import InvalidArgumentError
    from services.trainer.job.run.reply_lengths import check_reply_lengths

    job = yaml.safe_load((ROOT / "examples" / "workflows" / "debate" / "debate.yaml").read_text())
    job["agents"][2]["sampling"] = {"max_new_tokens": 4096}  # agent_3, the scripted calculator
    check_reply_lengths(config_from_dict(job))
    job["agents"][1]["sampling"] = {"max_new_tokens": 4096}  # agent_2, a model solver
    with pytest.raises(
        InvalidArgumentError, match=r"^agent 'agent_2' \(agents\[1\]\): agents\[1\]\.sampling"
    ):
        check_reply_lengths(config_from_dict(job))


@pytest.mark.parametrize("engine", ["hf", "auto"])  # auto on device cpu (tiny.yaml's) cannot be vLLM
def test_the_check_imports_no_torch_so_a_later_refusal_stays_quick(tmp_path, engine):
    """The reply-length check runs in every job before the run folder; it reads the models' configs alone, so a
    job refused after it (here: a folder that holds a run, without --resume or --overwrite) is refused without
    importing torch (about 1.2 CPU s of the 1.9 s such a refusal took with it, 2026-12-06, the 2-core Xeon)."""
    import subprocess
    import sys

    (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
    code = (
        "import sys, marti.command.main as c\n"
        f"rc = c.main(['train', 'examples/tiny.yaml', '--set', 'output.dir={tmp_path}', '--set', "
        f"'rollout.engine={engine}', '--no-progress'])\n"
        "print('RC=%s TORCH=%s' % (rc, 'torch' in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "already holds a run" in out.stderr, out.stderr[-2000:]
    assert "RC=2 TORCH=False" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
