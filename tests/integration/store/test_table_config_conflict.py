"""A job whose table exists on the store with another config (``--resume`` with a changed
``rollout.max_staleness`` against an external store) is refused naming the differing fields, both values, the
job settings that make the table and what to do, instead of only "already exists with another config"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import marti
from marti.errors import AlreadyExistsError
from services.trainer.data.tables import claim_tables

ROOT = Path(__file__).resolve().parents[3]


def test_a_job_table_with_another_staleness_names_the_fields_and_the_way_out(store_server):
    store = marti.ExperienceSharingClient(agent_id="t", address=store_server[0])
    try:
        claim_tables(store, "neg5", {"seller": 0}, 1000, lambda fn, what: fn())  # the first job
        with pytest.raises(AlreadyExistsError) as info:
            claim_tables(
                store, "neg5", {"seller": 1}, 1000, lambda fn, what: fn()
            )  # resumed, max_staleness 1
    finally:
        store.close()
    msg = str(info.value)
    assert (
        "table 'neg5/seller' already exists with another config: max_policy_lag is 0 there, 1 asked." in msg
    )
    assert "max_size" not in msg.split(". The store")[0]  # only the fields that differ
    assert "--config tables YAML" in msg and "another --data-dir" in msg
    assert "rollout.max_staleness" in msg and "set another training_name" in msg


def test_create_table_with_another_config_names_every_differing_field(store_server):
    store = marti.ExperienceSharingClient(agent_id="t", address=store_server[0])
    try:
        store.create_table("q", preset="queue", max_size=7)
        with pytest.raises(AlreadyExistsError, match=r"max_size is 7 there, 9 asked; max_times_sampled"):
            store.create_table("q", sampler="uniform", max_size=9)
    finally:
        store.close()


def test_marti_train_resume_with_another_max_staleness_on_an_external_store(store_server, tmp_path):
    """As the user meets it: ``marti train --store ADDR``, then ``--resume --set rollout.max_staleness=1``."""
    args = [sys.executable, "-m", "marti.command.main", "train", str(ROOT / "examples" / "tiny.yaml")]
    args += ["--store", store_server[0], "--set", f"output.dir={tmp_path / 'run'}"]
    first = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    again = args + ["--resume", "--set", "max_steps=3", "--set", "rollout.max_staleness=1"]
    out = subprocess.run(again, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    store = f"marti train: store at {store_server[0]} (--store or services.store): "
    assert last.startswith(store + "table 'tiny/agent_1' already exists with another config: "), last
    assert "max_policy_lag is 0 there, 1 asked" in last and "set another training_name" in last, last
    assert "Traceback" not in out.stderr
    # --overwrite with the same change: refused before the run folder is cleared (the tables are checked
    # on the given store first), so the first run is still there
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*") if ".lock" not in p.name)
    again = args + ["--overwrite", "--set", "rollout.max_staleness=1"]
    out = subprocess.run(again, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and "max_policy_lag is 0 there, 1 asked" in out.stderr, out.stderr[-2000:]
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*") if ".lock" not in p.name)
    assert after == before and (tmp_path / "run" / "report.md").exists()
