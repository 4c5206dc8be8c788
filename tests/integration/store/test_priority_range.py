"""Priorities a prioritized table cannot weigh (``p ** priority_exponent`` beyond what a float sum holds), over a
real store: each was a finite, non-negative priority the store took, and then a sample spun forever holding the
table's lock (the sum tree's total overflowed to infinity) or an insert failed with INTERNAL halfway, leaving an
item the table counted but never stored."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from faults.procs import start

from marti.clients.experience import ExperienceSharingClient
from marti.errors import InvalidArgumentError
from marti.types.trajectory import Trajectory


def _traj(episode: str) -> Trajectory:
    return Trajectory(episode_id=episode, agent_id="a")


def test_priorities_whose_weights_would_overflow_the_sum_are_refused_and_the_table_samples_on(store_server):
    """Two items of priority 1.5e308 (alpha 1): their sum is infinite, and the next sample never returned
    (the server thread spun at 100% CPU holding the table's lock; every later call on the table hung)."""
    with ExperienceSharingClient("a", store_server[0], timeout_s=5) as client:
        client.create_table("p", sampler="prioritized", priority_exponent=1.0, max_size=100)
        with pytest.raises(
            InvalidArgumentError, match=r"item 0 of 2 .*priority is 1\.5e\+308; .*over 1e\+280"
        ):
            client.share_experiences([_traj("x0"), _traj("x1")], table="p", priorities=[1.5e308, 1.5e308])
        keys = client.share_experiences([_traj("y0"), _traj("y1")], table="p", priorities=[1e280, 1e280])
        assert len(client.sample("p", 4, timeout_s=5)) == 4
        with pytest.raises(InvalidArgumentError, match=rf"priority of key {keys[1]} is 1e\+300; "):
            client.update_priorities("p", {keys[0]: 1.0, keys[1]: 1e300})
        assert [s.priority for s in client.get_items(agent_id="a", tables=["p"])] == [1e280, 1e280]


def test_a_weight_that_overflows_the_exponent_is_refused_and_nothing_of_it_stays(store_server):
    """alpha 2 and priority 1e200: ``1e200 ** 2`` raised OverflowError inside the table's insert, after the item
    was counted and before anything was committed: INTERNAL for the whole call, a table size of 2 holding no
    readable item, and the call's first item (priority 0.5) sampled but never stored."""
    with ExperienceSharingClient("a", store_server[0], timeout_s=5) as client:
        client.create_table("p2", sampler="prioritized", priority_exponent=2.0, max_size=100)
        with pytest.raises(
            InvalidArgumentError,
            match=r"item 1 of 2 .*priority is 1e\+200; its weight, 1e\+200 \*\* priority_exponent 2\.0,",
        ):
            client.share_experiences([_traj("ok"), _traj("big")], table="p2", priorities=[0.5, 1e200])
        info = client.info("p2")
        assert (info.size, info.inserts) == (1, 1)
        assert [t.episode_id for t in client.get_trajectories(agent_id="a", tables=["p2"])] == ["ok"]


def test_an_infinite_priority_exponent_is_refused(store_server):
    with ExperienceSharingClient("a", store_server[0]) as client:
        with pytest.raises(InvalidArgumentError, match="priority_exponent: Input should be a finite number"):
            client.create_table("pinf", sampler="prioritized", priority_exponent=float("inf"))


def test_a_restart_whose_priority_exponent_cannot_weigh_a_stored_priority_stops_in_one_line(tmp_path):
    """A table restarted with a larger ``priority_exponent`` (a new ``--config``) than its stored priorities
    allow: ``marti store`` died with an OverflowError traceback. Now it stops with one line naming the table, the
    item and its priority (exit 2), and keeps the stored config, so the old one still starts."""
    data, old, new = tmp_path / "data", tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text("tables:\n  - {name: pr, sampler: prioritized, priority_exponent: 1.0}\n")
    new.write_text("tables:\n  - {name: pr, sampler: prioritized, priority_exponent: 2.0}\n")
    svc = start("store", "--data-dir", str(data), "--config", str(old))
    try:
        with ExperienceSharingClient("a", svc.address) as client:
            (key,) = client.share_experiences([_traj("big")], table="pr", priorities=[1e200])
        svc.signal(signal.SIGTERM)
        assert svc.proc.wait(timeout=60) == 0
    finally:
        svc.stop()
    res = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "store", "--port", "0", "--data-dir", str(data), "--config",
         str(new)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert (
        f"marti store: error: table 'pr': the priority of its item {key} is 1e+200; its weight, 1e+200 ** "
        "priority_exponent 2.0, is over 1e+280"
    ) in res.stderr
    svc = start("store", "--data-dir", str(data), "--config", str(old))
    try:
        with ExperienceSharingClient("a", svc.address) as client:
            assert [s.priority for s in client.get_items(episode_id="big")] == [1e200]
    finally:
        svc.stop()
