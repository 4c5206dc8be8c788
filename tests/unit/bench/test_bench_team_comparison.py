"""``marti bench team_comparison``'s pure parts: the arms' configs, the 95% interval, the summary of runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

import marti.env.make as me
from benchmarks import team_comparison as tc
from marti.config.load import config_from_dict
from services.trainer.rollout.episodes.env_config import env_config

EXAMPLE = tc.PRIVATE_CONFIG


def _cfg(arm: str, tmp_path: Path, **kw) -> dict:
    args = {"seed": 1, "steps": 5, "model": "smollm2-135m-instruct", "episodes": 6, "group": 3}
    args.update(kw)
    scenario = "private_allocation" if arm in tc.PRIVATE_ARMS else "resource_allocation"
    return tc.arm_config(arm, out_dir=tmp_path / arm, scenario=args.pop("scenario", scenario), **args)


# ---- arm configs ----
def test_private_arms_play_the_examples_scenario_with_their_agents_and_views(tmp_path):
    example = yaml.safe_load(EXAMPLE.read_text())
    executor = next(a for a in example["agents"] if a["role"] == "executor")
    built = {arm: _cfg(arm, tmp_path) for arm in tc.PRIVATE_ARMS}
    team, part, full = built["team"], built["solo_part"], built["solo_all"]
    assert [a["role"] for a in team["agents"]] == ["planner", "executor", "evaluator"]
    assert team["num_agents"] == 3 and "solo_view" not in team["environment"].get("options", {})
    for cfg, view in ((part, "executor"), (full, "all")):
        assert cfg["num_agents"] == 1 and cfg["environment"]["options"]["solo_view"] == view
        assert cfg["agents"] == [{**executor, "name": "agent_1"}]
    for arm, cfg in built.items():
        assert cfg["environment"]["scenario"] == "private_allocation"
        env = {k: v for k, v in cfg["environment"].items() if k != "options"}
        assert env == {k: v for k, v in example["environment"].items() if k != "options"}  # max_turns too
        assert cfg["seed"] == 1 and cfg["max_steps"] == 5 and cfg["rollout"]["eval_every"] == 5
        assert cfg["rollout"]["episodes_per_step"] == 6 and cfg["rollout"]["group_size"] == 3
        assert cfg["output"]["dir"] == str(tmp_path / arm)
        assert cfg["budget"] == {"max_wall_time_s": tc.SAFETY_WALL_TIME_S}
        # everything else is the example's, the same for every arm
        for key in ("learning_rate", "algorithm", "policy", "reward_alloc", "micro_train_batch_size"):
            assert cfg[key] == example[key], key
        same = {
            k: v
            for k, v in cfg["rollout"].items()
            if k not in ("episodes_per_step", "group_size", "eval_every")
        }
        assert same == {k: example["rollout"][k] for k in same}
        assert all(a["pretrain_model"] == "smollm2-135m-instruct" for a in cfg["agents"])
    assert len({c["training_name"] for c in built.values()}) == 3


def test_each_arm_config_validates_and_builds_its_env(tmp_path):
    """As ``marti train`` would: the config loads and the env it describes is the arm's team or solo view."""
    views = {"team": None, "solo_part": "executor", "solo_all": "all"}
    for arm, view in views.items():
        cfg = config_from_dict(_cfg(arm, tmp_path, eval_episodes=8))
        assert cfg.rollout.eval_episodes == 8
        env = me.make(cfg.environment.env_name, **env_config(cfg))
        env.reset(seed=0)
        assert env.env.solo_view == view
        assert len(env.possible_agents) == (3 if arm == "team" else 1)
        if view:
            assert env.env.view_of == {"agent_1": view}


def test_walltime_budget_sets_the_wall_time_key_and_the_step_cap(tmp_path):
    for arm in (*tc.PRIVATE_ARMS, *tc.ARMS):
        cfg = _cfg(arm, tmp_path, steps=1000, budget="walltime", wall_time_s=450)
        assert cfg["budget"] == {"max_wall_time_s": 450.0}
        assert cfg["max_steps"] == 1000 and cfg["rollout"]["eval_every"] == 1000  # evaluated first and last
        assert config_from_dict(cfg).budget.max_wall_time_s == 450.0
    with pytest.raises(ValueError, match="wall_time_s > 0"):
        _cfg("team", tmp_path, budget="walltime")
    with pytest.raises(ValueError, match="budget must be one of"):
        _cfg("team", tmp_path, budget="flops")


def test_resource_allocation_arms_are_unchanged(tmp_path):
    single, multi = _cfg("single", tmp_path), _cfg("multi", tmp_path)
    assert single["environment"]["scenario"] == multi["environment"]["scenario"] == "resource_allocation"
    assert single["num_agents"] == 1 and [a["role"] for a in single["agents"]] == ["executor"]
    assert "options" not in single["environment"] and len(multi["agents"]) == 3
    assert single["training_name"] == "teamcmp_single_s1"
    with pytest.raises(ValueError, match="arm of private_allocation"):
        _cfg("single", tmp_path, scenario="private_allocation")
    with pytest.raises(ValueError, match="arm of resource_allocation"):
        _cfg("team", tmp_path, scenario="resource_allocation")
    with pytest.raises(ValueError, match="multiple of group"):
        _cfg("team", tmp_path, episodes=4)


# ---- the 95% interval ----
def test_t_quantiles_match_closed_forms_and_tables():
    assert tc.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-6)  # Cauchy: 12.7062
    assert tc.t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), abs=1e-6)  # 4.3027
    assert tc.t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-5)
    assert tc.t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-5)
    assert tc.t_cdf(0.0, 3) == 0.5 and tc.t_cdf(-2.0, 5) == pytest.approx(1 - tc.t_cdf(2.0, 5))
    with pytest.raises(ValueError):
        tc.t_quantile(0.2, 3)


def test_interval_of_three_seeds_by_hand():
    # mean 0.4, s = 0.2, n = 3: half = t(0.975, 2) * 0.2 / sqrt(3) = 4.302653 * 0.115470 = 0.496828
    iv = tc.interval95([0.2, 0.4, 0.6])
    assert iv["n"] == 3 and iv["mean"] == pytest.approx(0.4)
    assert iv["half"] == pytest.approx(0.496828, abs=1e-6)
    assert (iv["low"], iv["high"]) == (pytest.approx(-0.096828, abs=1e-6), pytest.approx(0.896828, abs=1e-6))
    # two seeds: t(0.975, 1) = 12.706205; s = 0.1 * sqrt(2); half = 12.706205 * 0.1 = 1.2706205
    assert tc.interval95([1.0, 1.2])["half"] == pytest.approx(1.2706205, abs=1e-6)
    assert tc.interval95([0.5]) == {"n": 1, "mean": 0.5, "half": None, "low": None, "high": None}
    assert tc.interval95([])["mean"] is None


# ---- the summary of finished runs ----
#: arm -> seed -> (held-out completion before, after, team score before, after, samples per step, steps, wall s)
FIXTURE = {
    "team": {0: (0.0, 0.25, -0.5, 0.10, 18, 2, 400), 1: (0.0, 0.50, -0.5, 0.30, 18, 2, 420), 2: (0.0, 0.75, -0.4, 0.50, 18, 2, 410)},
    "solo_part": {0: (0.0, 0.25, -0.5, 0.00, 9, 2, 200), 1: (0.25, 0.25, -0.3, 0.20, 7, 2, 220), 2: (0.0, 0.25, -0.5, 0.10, 8, 2, 210)},
    "solo_all": {0: (0.25, 1.0, 0.2, 0.9, 6, 2, 180), 1: (0.25, 0.75, 0.1, 0.8, 6, 2, 190)},  # seed 2 not run
}  # fmt: skip


def _write_run(out: Path, arm: str, seed: int, row: tuple) -> None:
    c0, c1, s0, s1, per_step, steps, wall = row
    d = out / f"{arm}_s{seed}"
    d.mkdir(parents=True)
    agents = 3 if arm == "team" else 1
    metrics = [
        {
            "step": k + 1,
            "metrics": {
                "team/team_score": s0 + (s1 - s0) * (k + 1) / steps,
                **{f"agent_{i + 1}/num_samples": per_step / agents for i in range(agents)},
            },
        }
        for k in range(steps)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    evals = [
        {"step": 0, "table": {"team/task_completion": c0, "team/team_score": s0}},
        {"step": steps, "table": {"team/task_completion": c1, "team/team_score": s1}},
    ]
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (d / "bench_run.json").write_text(
        json.dumps({"rc": 0, "wall_s": wall, "load_before": 1.0, "load_after": 1.5})
    )


def _results(tmp_path: Path) -> dict:
    for arm, runs in FIXTURE.items():
        for seed, row in runs.items():
            _write_run(tmp_path, arm, seed, row)
    return {
        arm: {seed: tc.summarize_run(tmp_path / f"{arm}_s{seed}", 0.0) for seed in (0, 1, 2)}
        for arm in FIXTURE
    }


def test_summary_of_fixture_runs(tmp_path):
    results = _results(tmp_path)
    assert results["team"][1]["samples"] == 36 and results["solo_part"][1]["samples"] == 14
    assert results["solo_all"][2]["steps"] == 0  # not run: left out of the summary
    s = tc.summarize_arms(results, "team")
    team, part, full = s["team"], s["solo_part"], s["solo_all"]
    assert team["seeds"] == [0, 1, 2] and full["seeds"] == [0, 1]
    assert team["samples"] == [36, 36, 36] and part["samples"] == [18, 14, 16] and part["samples_mean"] == 16
    assert part["ratio_samples"] == pytest.approx(16 / 36) and team["ratio_samples"] == 1.0
    assert part["ratio_wall_s"] == pytest.approx(210 / 410) and full["ratio_wall_s"] == pytest.approx(
        185 / 410
    )
    # team completion after: 0.25, 0.5, 0.75 -> mean 0.5, s 0.25, half 4.302653 * 0.25 / sqrt(3) = 0.621034
    after = team["completion after"]
    assert after["mean"] == pytest.approx(0.5) and after["half"] == pytest.approx(0.621034, abs=1e-6)
    assert part["completion before"]["mean"] == pytest.approx(0.25 / 3)
    # solo_part team score after - team's, paired by seed: -0.1, -0.1, -0.4 -> mean -0.2, s 0.173205,
    # half 4.302653 * 0.173205 / sqrt(3) = 0.430265
    diff = part["team score after - team"]
    assert diff["mean"] == pytest.approx(-0.2) and diff["half"] == pytest.approx(0.430265, abs=1e-6)
    # solo_all against the team over the two seeds both finished: 0.8, 0.5 -> mean 0.65, half 12.706205 * 0.15
    diff = full["team score after - team"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(0.65)
    assert diff["half"] == pytest.approx(12.706205 * 0.15, abs=1e-5)
    assert team["team score after - team"]["mean"] == 0.0
    text = tc.summary_table(s, "team")
    assert "| team (reference) | 0 1 2 | 2/2/2 | 36.0 | 1.00x | 410 | 1.00x |" in text
    assert "| solo_part | 0 1 2 | 2/2/2 | 16.0 | 0.44x |" in text
    assert "0.500 [-0.121, 1.121]" in text and "-0.200 [-0.630, 0.230]" in text


def test_a_run_without_its_final_evaluation_has_no_after(tmp_path):
    """A run stopped during its final evaluation: its step-0 evaluation is not taken as the result after."""
    results = _results(tmp_path)
    d = tmp_path / "solo_all_s2"
    _write_run(tmp_path, "solo_all", 2, (0.0, 1.0, -0.5, 1.0, 6, 2, 170))
    (d / "eval.jsonl").write_text(
        json.dumps({"step": 0, "table": {"team/task_completion": 0.0, "team/team_score": -0.5}}) + "\n"
    )
    results["solo_all"][2] = tc.summarize_run(d, 0.0)
    assert results["solo_all"][2]["last_eval_step"] == 0 and results["solo_all"][2]["steps"] == 2
    s = tc.summarize_arms(results, "team")["solo_all"]
    assert s["seeds"] == [0, 1, 2] and s["evaluated_after"] == [0, 1]
    assert s["completion before"]["n"] == 3 and s["completion after"]["n"] == 2
    assert s["team score after - team"]["n"] == 2 and s["team score after"]["mean"] == pytest.approx(0.85)
    row = next(
        line
        for line in tc.summary_table({"solo_all": s}, "team").splitlines()
        if line.startswith("| solo_all | 0.")
    )
    assert "0.875 [-0.713, 2.463] (n=2)" in row


def test_summary_without_the_reference_has_no_ratios(tmp_path):
    results = _results(tmp_path)
    s = tc.summarize_arms({"solo_part": results["solo_part"]}, "team")
    assert s["solo_part"]["ratio_samples"] is None and s["solo_part"]["team score after - team"]["n"] == 0
    assert "| solo_part | 0 1 2 | 2/2/2 | 16.0 | - |" in tc.summary_table(s, "team")


def test_summarize_only_prints_the_tables_and_writes_json(tmp_path, capsys):
    _results(tmp_path)
    out = tmp_path / "tc.json"
    argv = [
        "--scenario",
        "private_allocation",
        "--summarize-only",
        "--out",
        str(tmp_path),
        "--json",
        str(out),
    ]
    assert tc.main(argv) == 0
    printed = capsys.readouterr().out
    assert "load average before:" in printed and "load average after:" in printed
    assert "Equal: 4 training steps x 6 episodes per step" in printed and "Not equal: samples" in printed
    lines = printed.splitlines()  # the per-run and per-arm Markdown tables
    assert "|---|---:|---:|---|---|---|---|---|---:|---:|---|" in lines and "|---|" + "---|" * 8 in lines
    assert "| team | 2 | 2 | - | 0.00 -> 0.75 | - | -0.40 -> 0.50 | 0.05 0.50 | 2 | 410 | 1.0/1.5 |" in lines
    assert (
        "| solo_all | - | 0.875 ± 0.177 | - | - | 0.850 ± 0.071 | 0.850 ± 0.071 | 0.675 ± 0.071 | 2/2 |"
        in lines
    )
    data = json.loads(out.read_text())
    assert (
        data["reference"] == "team"
        and data["budget"] == "samples"
        and set(data["arms"]) == set(tc.PRIVATE_ARMS)
    )
    assert data["arms"]["solo_part"]["samples"] == [18, 14, 16] and len(data["loadavg_before"]) == 3
    assert data["runs"]["team"]["0"]["last_eval"]["team/task_completion"] == 0.25


def test_what_is_equal_under_each_budget():
    samples = tc.equal_under("samples", steps=6, episodes=6, group=3, wall_time_s=None)
    assert samples.startswith("Equal: 6 training steps x 6 episodes per step (groups of 3)")
    wall = tc.equal_under("walltime", steps=1000, episodes=6, group=3, wall_time_s=900)
    assert (
        wall.startswith("Equal: a wall-time budget of 900 s per run")
        and "Not equal: steps (at most 1000)" in wall
    )


def test_config_builds_the_arms_from_another_team_config(tmp_path):
    """``--config``: the arms come from the given team (here the two-agent ``pick`` example), not the scenario's
    example; the solo arms take its executor; a config of another scenario is refused, naming both."""
    pick = tc.ROOT / "examples" / "private_allocation_pick.yaml"
    example = yaml.safe_load(pick.read_text())
    built = {arm: _cfg(arm, tmp_path, config=pick, episodes=12, group=6) for arm in tc.PRIVATE_ARMS}
    assert [a["role"] for a in built["team"]["agents"]] == ["planner", "executor"]
    assert built["team"]["environment"]["difficulty"] == "pick"
    executor = next(a for a in example["agents"] if a["role"] == "executor")
    for arm in ("solo_part", "solo_all"):
        assert built[arm]["agents"] == [{**executor, "name": "agent_1"}]
        assert built[arm]["environment"]["difficulty"] == "pick"
    for arm, cfg in built.items():
        loaded = config_from_dict(cfg)
        assert loaded.rollout.max_new_tokens == example["rollout"]["max_new_tokens"]
        env = me.make(loaded.environment.env_name, **env_config(loaded))
        env.reset(seed=0)
        assert env.env.ranked and len(env.possible_agents) == (2 if arm == "team" else 1)
    with pytest.raises(
        ValueError, match="scenario 'resource_allocation', not of --scenario 'private_allocation'"
    ):
        _cfg("team", tmp_path, config=tc.BASE_CONFIG)


def test_config_flag_names_the_output_root_and_the_json(tmp_path, monkeypatch, capsys):
    pick = tc.ROOT / "examples" / "private_allocation_pick.yaml"
    out = tmp_path / "tc.json"
    monkeypatch.setattr(tc, "ROOT", tmp_path)  # the default output root goes under tmp_path
    _results(tmp_path / "runs" / "team_comparison" / "private_allocation_pick_samples")
    argv = ["--scenario", "private_allocation", "--config", str(pick), "--summarize-only", "--json", str(out)]
    assert tc.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["config"] == str(pick)
    assert (
        data["runs"]["team"]["0"]["last_eval"]["team/task_completion"] == 0.25
    )  # read from <config>_<budget>
    assert "scenario private_allocation, budget samples" in capsys.readouterr().out


def test_a_config_that_cannot_give_the_arms_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    """--config problems exit 2 with a message naming the file, before any arm trains."""
    monkeypatch.setattr(tc, "run_arm", lambda cfg, out: pytest.fail("an arm ran"))
    pick = yaml.safe_load((tc.ROOT / "examples" / "private_allocation_pick.yaml").read_text())
    no_executor = tmp_path / "no_executor.yaml"
    no_executor.write_text(yaml.safe_dump({**pick, "num_agents": 1, "agents": pick["agents"][:1]}))
    bare = (
        tmp_path / "bare_scenario.yaml"
    )  # no environment.scenario: the schema's default, resource_allocation
    env = {k: v for k, v in pick["environment"].items() if k not in ("scenario", "difficulty")}
    bare.write_text(yaml.safe_dump({**pick, "environment": env}))
    cases = [
        (["--config", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (["--config", str(tmp_path)], str(tmp_path)),
        (["--config", str(no_executor), "--arms", "team", "solo_part"], "no agent of role 'executor'"),
        (["--config", str(bare)], "scenario 'resource_allocation', not of --scenario 'private_allocation'"),
    ]
    for extra, said in cases:
        with pytest.raises(SystemExit) as exit_:
            tc.main(["--scenario", "private_allocation", "--out", str(tmp_path / "out"), *extra])
        assert exit_.value.code == 2
        assert said in capsys.readouterr().err, extra
    assert tc.config_problem(no_executor, "private_allocation", ["team"]) is None  # the team alone is fine
    assert tc.config_problem(bare, "resource_allocation", ["single"]) is None
