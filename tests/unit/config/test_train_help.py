"""``marti train --help`` lists every launch flag, grouped by topic, one line each."""

from __future__ import annotations

import re

import pytest

from marti.command.launch_flags import FLAG_GROUPS, FLAG_TABLE, flag_help
from services.trainer.job.cli.train_cli import build_parser, main


def test_every_launch_flag_is_in_exactly_one_group():
    grouped = [name for names in FLAG_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(FLAG_TABLE)
    assert len(grouped) == len(set(grouped))


def test_help_shows_each_flag_once_on_one_line_under_its_group(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    sections = re.split(r"\n(?=launch flags: )", text)
    by_title = {s.splitlines()[0].rstrip(":"): s for s in sections if s.startswith("launch flags: ")}
    assert set(by_title) == {f"launch flags: {t}" for t in FLAG_GROUPS}
    for title, names in FLAG_GROUPS.items():
        body = by_title[f"launch flags: {title}"]
        for name in names:
            lines = [ln for ln in body.splitlines() if re.match(rf"\s+--{name}\b", ln)]
            assert len(lines) == 1, f"--{name} under {title!r}: {lines}"
            assert flag_help(name)[1] in lines[0]  # the help (config keys it sets) is on the same line
    assert "--use_flash_attn" in text and "policy.attn_implementation" in text


def test_help_only_flags_are_not_parsed_by_the_own_parser():
    args = build_parser().parse_args(["cfg.yaml", "--resume"])
    assert args.config == "cfg.yaml" and args.resume


@pytest.mark.parametrize(("command", "expected"), [("train", "false"), ("env-server", None)])
def test_commands_that_start_ray_turn_grpc_fork_handlers_off_before_importing_grpc(command, expected):
    """``marti train`` (and the trainer service, ``marti eval``) start Ray by fork-then-exec: gRPC's fork
    handlers go off there; other commands and user programs keep gRPC's default."""
    import os
    import subprocess
    import sys

    code = (
        "import os, sys, marti.command.main as c\n"
        "try:\n"
        f"    c.main([{command!r}, '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('FORK=' + str(os.environ.get('GRPC_ENABLE_FORK_SUPPORT')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert f"FORK={expected}" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["examples/tiny.yaml", "--set", "bogus=1"], "bogus"),  # an unknown key
        (["examples/tiny.yaml", "--set", "agents.0.pretrain_model=no/such/model"], "no/such/model"),
        (["examples/tiny.yaml", "--set", "policy.attn_implementation=fast"], "attn_implementation"),
        (["examples/tiny.yaml", "--set", "rollout.group_size=3"], "group_size"),
    ],
)
def test_a_config_refusal_comes_before_torch_is_imported(args, named):
    """A bad config is refused by ``marti train`` in well under a second: nothing on that path imports torch
    (importing it took about 1 s of the 2.7 s such a refusal took before, on a 2-core Xeon)."""
    out = _train_in_a_subprocess(args)
    assert "RC=2 TORCH=False" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert named in out.stderr, out.stderr[-2000:]


LORA_KEYS = ["--unset", "policy.lora_r", "--unset", "policy.lora_alpha"]  # tiny.yaml's lora_r 4, lora_alpha 8


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (["policy.mode=per_agent"], "policy.lora_r=4 (default 8), policy.lora_alpha=8.0 (default 16.0)"),
        (["algorithm.kl_coef=0", "algorithm.kl_estimator=k2"], "algorithm.kl_estimator=k2 (default k3)"),
        (["algorithm.advantage_estimator=dr_grpo", "algorithm.adv_eps=0.1"], "algorithm.adv_eps=0.1"),
        (["rollout.merge_adapters=2"], "rollout.merge_adapters=2 (default 1)"),
    ],
)
def test_an_unread_key_is_refused_in_one_line_before_torch_is_imported(sets, named):
    """``marti train`` with a key that the rest of the config leaves unread: exit 2, one line naming the key and
    the ``--unset`` that fixes it, before torch is imported."""
    out = _train_in_a_subprocess(["examples/tiny.yaml", *[a for s in sets for a in ("--set", s)]])
    assert "RC=2 TORCH=False" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marti train: examples/tiny.yaml: "), out.stderr[-2000:]
    assert named in lines[0] and f"--unset {named.split('=')[0]}" in lines[0], lines[0]


def test_unset_lets_the_same_job_through_the_config_check():
    """With the ``--unset`` the refusal names, the config loads: the next check (the model) refuses instead."""
    args = ["examples/tiny.yaml", "--set", "policy.mode=per_agent", *LORA_KEYS]
    out = _train_in_a_subprocess([*args, "--set", "agents.0.pretrain_model=no/such/model"])
    assert "RC=2" in out.stdout and "no/such/model" in out.stderr and "lora" not in out.stderr, out.stderr
    out = _train_in_a_subprocess([*args, "--unset", "policy.lora_rr"])
    assert (
        "unknown config key 'policy.lora_rr' in --unset 'policy.lora_rr' (did you mean 'lora_r'?)"
        in out.stderr
    )


def test_marti_eval_takes_unset_too(tmp_path, capsys):
    """``marti eval`` reads the same config: refused with the LoRA keys in per_agent mode, loaded with --unset
    (then it finds no checkpoint in the fresh output folder)."""
    from services.trainer.job.cli import eval_cli

    args = [
        "examples/tiny.yaml",
        "--set",
        "policy.mode=per_agent",
        "--set",
        f"output.dir={tmp_path}",
        "--no-baseline",
    ]
    assert eval_cli.main(args) == 2
    assert "--unset policy.lora_r --unset policy.lora_alpha" in capsys.readouterr().err
    assert eval_cli.main([*args, *LORA_KEYS]) == 2
    assert "no checkpoint given and none found" in capsys.readouterr().err


def _train_in_a_subprocess(args: list[str]):
    """Run ``marti.command.main.main(['train', *args])`` in a fresh interpreter; its stdout ends ``RC=<exit> TORCH=<bool>``
    (whether torch was imported)."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, marti.command.main as c\n"
        f"rc = c.main(['train', *{args!r}])\n"
        "print('RC=%s TORCH=%s' % (rc, 'torch' in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[3]
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
