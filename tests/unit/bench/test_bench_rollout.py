"""``marti bench rollout`` end to end on real services, one step per arm: both arms in the JSON, and the trainer's
shared channels open fewer channels and make fewer round trips than a channel per episode."""

from __future__ import annotations

import json

import grpc

from benchmarks import rollout
from marti.clients.env import SessionStream


def test_one_step_of_both_arms_writes_the_json(tmp_path, capsys):
    real_channel, real_roundtrip = grpc.insecure_channel, SessionStream._roundtrip
    out = tmp_path / "rollout.json"
    assert rollout.main(["--steps", "1", "--warmup", "0", "--json", str(out)]) == 0
    # The counting patches are undone.
    assert grpc.insecure_channel is real_channel and SessionStream._roundtrip is real_roundtrip

    data = json.loads(out.read_text())
    arms = data["arms"]
    assert set(arms) == {"per-episode", "shared"} and data["baseline"] == "per-episode"
    base, shared = arms["per-episode"], arms["shared"]
    for s in (base, shared):
        assert s["median_s"] > 0 and s["mean_s"] > 0 and len(s["step_s"]) == 1
        assert s["episodes_per_step"] > 0 and s["round_trips_per_step"] > 0
    # Same seeds, same deterministic replies: the same episodes in both arms.
    assert base["turns_per_step"] == shared["turns_per_step"] > 0
    # Deterministic: the loop's two channels (opened in this first step) against a channel per env session and
    # per comm client; buffered sends and BatchStep save round trips.
    assert shared["channels_per_step"] == 2
    assert base["channels_per_step"] > shared["channels_per_step"]
    assert base["round_trips_per_step"] > shared["round_trips_per_step"]
    assert shared["round_trips_by_method"].get("BatchStep", 0) > 0
    assert "BatchStep" not in base["round_trips_by_method"]
    assert shared["ratio_round_trips"] > 1 and base["ratio_median_s"] == 1
    assert len(data["loadavg_before"]) == len(data["loadavg_after"]) == 3

    printed = capsys.readouterr().out
    assert "| per-episode (baseline) |" in printed and "| shared |" in printed
    assert "load average before" in printed and "load average after" in printed
