"""The report of ``marti bench trainer`` (:mod:`benchmarks.trainer`): per-arm numbers, ours against each TRL
arm (throughput ratios, the reward verdict, the target), the Markdown table and what each arm computed in."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.report import markdown_table

#: Target of issue 33 (issue 6's was 1.5): our throughput at least this multiple of each TRL arm's, at equal or
#: better reward.
TARGET_RATIO = 3.0

#: The TRL arms: side name -> the precision :mod:`benchmarks.trainer.trl_runner` runs it in.
TRL_ARMS = {"trl": "fp32", "trl_bf16": "bf16"}

#: Every side, in the order runs alternate and the table lists them.
SIDES = ("ours", *TRL_ARMS)


def _median(xs: list[float]) -> float:
    """Median of ``xs``; NaN when empty (older result files lack a series)."""
    return statistics.median(xs) if xs else float("nan")


def summarize(name: str, r: dict[str, Any], tail: int) -> dict[str, Any]:
    """Per-side numbers: samples/s, tokens/s, median step and its generation / update split, tail training reward,
    eval reward, what the side ran (``rollout`` for ours, ``precision`` for TRL, ``observed`` dtypes), its step and
    sample counts, and ``threads`` (its :meth:`~benchmarks.trainer.thread_probe.ThreadProbe.report`; None for result
    files older than that probe)."""
    t = r["train_time_s"]
    steps = r["step_times_s"]
    gens = r.get("generation_s", [])
    return {
        "side": name,
        "train_s": t,
        "samples_per_s": r["samples"] / t,
        "gen_tokens_per_s": r["completion_tokens"] / t,
        "all_tokens_per_s": (r["completion_tokens"] + r["prompt_tokens"]) / t,
        "median_step_s": _median(steps),
        "median_generation_s": _median(gens),
        "median_update_s": _median([s - g for s, g in zip(steps, gens, strict=False)]),
        "median_samples_per_s": (r["samples"] / len(steps)) / _median(steps) if steps else float("nan"),
        "tail_reward": statistics.mean(r["step_rewards"][-tail:]) if r["step_rewards"] else float("nan"),
        "tail_rewards": list(r["step_rewards"][-tail:]),
        "eval_scores": list(r["eval"].get("scores", [])),
        "first_reward": r["step_rewards"][0] if r["step_rewards"] else float("nan"),
        "eval_reward": r["eval"]["reward"],
        "eval_accuracy": r["eval"]["accuracy"],
        "mean_completion_len": r["completion_tokens"] / max(1, r["samples"]),
        "load": r.get("load", float("nan")),
        "ran": {k: r[k] for k in ("rollout", "precision", "observed") if k in r},
        "steps": len(steps),
        "samples": r["samples"],
        "threads": r.get("threads"),
    }


def reward_comparison(ours: dict[str, Any], trl: dict[str, Any]) -> tuple[bool, str]:
    """Is our reward equal to or better than a TRL arm's, within one standard error of the difference?

    Training: the tail steps' mean rewards, difference of two means, SE = sqrt(var_o / n_o + var_t / n_t) over
    the per-step means. Held-out: both sides answer the same problems, so the difference is paired per problem,
    SE = stdev(d) / sqrt(n). "Equal or better" = each difference >= -SE (a difference inside sampling noise is
    equal; a zero SE demands >= 0).

    Returns:
        ``(ok, text)``: the verdict and a sentence with both differences and their SEs.
    """

    def se_two(a: list[float], b: list[float]) -> float:
        va = statistics.variance(a) / len(a) if len(a) > 1 else 0.0
        vb = statistics.variance(b) / len(b) if len(b) > 1 else 0.0
        return (va + vb) ** 0.5

    d_train = ours["tail_reward"] - trl["tail_reward"]
    se_train = se_two(ours["tail_rewards"], trl["tail_rewards"])
    same_problems = len(ours["eval_scores"]) == len(trl["eval_scores"])  # else older result files: no pairing
    paired = (
        [a - b for a, b in zip(ours["eval_scores"], trl["eval_scores"], strict=True)] if same_problems else []
    )
    d_eval = ours["eval_reward"] - trl["eval_reward"]
    se_eval = statistics.stdev(paired) / len(paired) ** 0.5 if len(paired) > 1 else 0.0
    ok = d_train >= -se_train and d_eval >= -se_eval
    text = (
        f"reward ours - TRL: training {d_train:+.3f} (SE {se_train:.3f}), held-out {d_eval:+.3f} "
        f"(paired SE {se_eval:.3f})"
    )
    return ok, text


def compare(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """Ours against one TRL arm: the throughput ratios, the reward verdict and the target.

    Args:
        ours, trl: :func:`summarize` rows.

    Returns:
        ``samples_per_s_ratio``, ``gen_tokens_per_s_ratio``, ``median_samples_per_s_ratio`` (ours / TRL),
        ``reward_ok`` and ``reward_text`` (:func:`reward_comparison`), ``target_ratio`` and ``met`` (samples/s
        ratio >= :data:`TARGET_RATIO` at an equal or better reward).
    """
    ratio_s = ours["samples_per_s"] / trl["samples_per_s"]
    reward_ok, reward_text = reward_comparison(ours, trl)
    return {
        "samples_per_s_ratio": ratio_s,
        "gen_tokens_per_s_ratio": ours["gen_tokens_per_s"] / trl["gen_tokens_per_s"],
        "median_samples_per_s_ratio": ours["median_samples_per_s"] / trl["median_samples_per_s"],
        "reward_ok": reward_ok,
        "reward_text": reward_text,
        "target_ratio": TARGET_RATIO,
        "met": ratio_s >= TARGET_RATIO and reward_ok,
    }


def comparisons(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`compare` of ours against every TRL arm among ``rows`` (TRL side name -> comparison); empty unless
    ours ran."""
    by = {r["side"]: r for r in rows}
    if "ours" not in by:
        return {}
    return {arm: compare(by["ours"], by[arm]) for arm in TRL_ARMS if arm in by}


def _side_cells(r: dict[str, Any]) -> list[str]:
    """One side's row of :func:`format_table`."""
    return [
        r["side"], f"{r['train_s']:.1f}", f"{r['samples_per_s']:.2f}", f"{r['gen_tokens_per_s']:.1f}",
        f"{r['all_tokens_per_s']:.1f}", f"{r['median_step_s']:.2f}", f"{r['median_generation_s']:.2f}",
        f"{r['median_update_s']:.2f}", f"{r['median_samples_per_s']:.2f}",
        f"{r['mean_completion_len']:.1f}", f"{r['first_reward']:.3f}", f"{r['tail_reward']:.3f}",
        f"{r['eval_reward']:.3f} ({r['eval_accuracy']:.2f})", f"{r['load']:.1f}",
    ]  # fmt: skip


def _ratio_line(arm: str, c: dict[str, Any], ours: dict[str, Any], trl: dict[str, Any], tail: int) -> str:
    """The sentence of ours against one TRL arm: ratios, rewards, verdict (and how far from the target)."""
    verdict = "met" if c["met"] else f"NOT met ({c['samples_per_s_ratio'] / TARGET_RATIO:.1%} of the ratio)"
    return (
        f"ours / {arm}: samples/s {c['samples_per_s_ratio']:.2f}x, generated tokens/s "
        f"{c['gen_tokens_per_s_ratio']:.2f}x, at the median step {c['median_samples_per_s_ratio']:.2f}x; "
        f"reward ours {ours['tail_reward']:.3f} vs {trl['tail_reward']:.3f} (training, last {tail} steps), "
        f"eval {ours['eval_reward']:.3f} vs {trl['eval_reward']:.3f}; {c['reward_text']} "
        f"({'equal or better' if c['reward_ok'] else 'LOWER'}). "
        f"Target >= {TARGET_RATIO}x at equal or better reward (within one SE): {verdict}."
    )


def describe(row: dict[str, Any]) -> str:
    """One line of what a side ran: its settings and the dtypes its first step's linear layers computed in,
    per phase, with their weights' dtypes (``"not recorded"`` for result files older than the probe)."""
    ran = row["ran"]
    if "rollout" in ran:
        what = (
            f"rollout engine {ran['rollout']['engine']}, sampling dtype {ran['rollout']['dtype'] or 'policy'}"
        )
    else:
        what = f"TRL precision {ran.get('precision', 'fp32')}"
    observed = ran.get("observed")
    seen = (
        ", ".join(
            f"{phase} in {'/'.join(d['compute'])} (weights {'/'.join(d['weights'])})"
            for phase, d in observed.items()
        )
        if observed
        else "not recorded"
    )
    return f"- {row['side']}: {what}; step 1 computed: {seen}"


def format_table(rows: list[dict[str, Any]], init_eval: dict[str, float], steps: int, tail: int) -> str:
    """Markdown table of every side (:func:`benchmarks.report.markdown_table`), a row of the untrained model's
    evaluation, what each side ran (:func:`describe`) and one ratio line per TRL arm."""
    header = ["side", "train s", "samples/s", "generated tok/s", "prompt+gen tok/s", "median step s",
              "median generation s", "median update s", "samples/s at median step", "mean completion tok",
              "reward step 1", f"reward last {tail} of {steps} steps", "eval reward (acc)", "load"]  # fmt: skip
    cells = [_side_cells(r) for r in rows]
    cells.append(
        ["untrained model", *[""] * 11, f"{init_eval['reward']:.3f} ({init_eval['accuracy']:.2f})", ""]
    )
    lines = [markdown_table(header, cells, "l" + "r" * 13), "", *[describe(r) for r in rows]]
    by = {r["side"]: r for r in rows}
    for arm, c in comparisons(rows).items():
        lines += ["", _ratio_line(arm, c, by["ours"], by[arm], tail)]
    return "\n".join(lines)
