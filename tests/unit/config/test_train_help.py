"""``marti train --help`` lists every launch flag, grouped by topic, one line each."""

from __future__ import annotations

import re

import pytest

from marti.launch_flags import FLAG_GROUPS, FLAG_TABLE, flag_help
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
        "import os, sys, marti.cli as c\n"
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
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, marti.cli as c\n"
        f"rc = c.main(['train', *{args!r}])\n"
        "print('RC=%s TORCH=%s' % (rc, 'torch' in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert "RC=2 TORCH=False" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert named in out.stderr, out.stderr[-2000:]
