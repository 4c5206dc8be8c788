"""An insert whose later commit fails on a full disk, over real gRPC: the SDK's error says which of the call's
items landed (the ones committed before the call waited for room), so the caller drops nothing unknowingly."""

from __future__ import annotations

import random
import threading
import time

from marti.clients.experience import ExperienceSharingClient
from marti.errors import ResourceExhaustedError
from marti.types.trajectory import Trajectory, Turn


def _traj(episode: str, tokens: int = 3) -> Trajectory:
    """A trajectory with ``tokens`` random response tokens (random, so its payload does not compress away)."""
    rng = random.Random(episode)
    ids = [rng.randrange(1 << 30) for _ in range(tokens)]
    turn = Turn(step=0, prompt_token_ids=[1, 2], response_token_ids=ids, response_logprobs=[-0.5] * tokens)
    return Trajectory(episode_id=episode, agent_id="a1", turns=[turn])


def _fill_the_disk(storage) -> None:
    """Let the database grow no further: SQLite then refuses a write with ``SQLITE_FULL`` ("database or disk is
    full"), the error a full disk gives (``PRAGMA max_page_count``, so no real disk has to fill up)."""
    pages = storage._wconn.execute("PRAGMA page_count").fetchone()[0]
    storage._wconn.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_after_a_wait_for_room_reports_the_keys_of_the_items_that_landed(store_server):
    """A ``share_experiences`` call of three items into a queue of two: the first two were committed, the call
    waited for room, a sampler made room, and the third item's commit failed on a full disk. The store answered
    every item of the call with RESOURCE_EXHAUSTED, so the caller was told nothing landed while two items had
    (and a resend stored them twice). Now the two keep their keys: the error is the third item's, carrying the
    two keys in ``metadata['inserted_keys']``, and the store holds exactly those."""
    addr, servicer = store_server
    store = servicer.store
    c, sampler = ExperienceSharingClient("a1", addr), ExperienceSharingClient("a2", addr)
    c.create_table("q", preset="queue", max_size=2)
    errors: list[BaseException] = []

    def share() -> None:
        try:
            c.share_experiences([_traj("e0"), _traj("e1"), _traj("big", 60_000)], table="q", timeout_s=30)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    inserter = threading.Thread(target=share)
    inserter.start()
    while store.table("q").info()["waiting_inserts"] != 1:
        time.sleep(0.01)
    _fill_the_disk(store.storage)
    (taken,) = sampler.sample_batch("q", 1, timeout_s=10).items  # room for the third item
    inserter.join(30)
    assert len(errors) == 1 and isinstance(errors[0], ResourceExhaustedError), errors
    err = errors[0]
    assert err.metadata["item"] == "2" and err.metadata["episode_id"] == "big"
    assert "is full (database or disk is full)" in err.message
    assert "2 of the other 2 items were inserted" in err.message
    (held,) = store.table("q").records()
    assert err.metadata["inserted_keys"] == f"{taken.key},{held.key}" and held.episode_id == "e1"
    assert [r.key for r in store.storage.load().items] == [held.key]  # on disk: e1 (e0 was sampled out)
    c.close()
    sampler.close()
