"""The trainer's data path over a real experience_store (gRPC on a free port): episodes inserted as they end,
each update's batch sampled from the agent's table, stale items removed by the table, groups kept whole by the
store, an insert retried after a lost answer and a failed attempt's episodes kept out by the store (idempotent
insert, delete), a second job reusing episode ids trained on, and trajectories an external process inserts
trained on."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from marti.clients.experience import ExperienceSharingClient
from marti.config import load_config
from marti.errors import FailedPreconditionError
from marti.rpc.testing import serve_in_thread
from marti.types.trajectory import Trajectory, Turn
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings
from services.trainer.data.batch_reader import BatchReader
from services.trainer.data.episode_writer import EpisodeWriter
from services.trainer.data.external import ExternalEpisodes
from services.trainer.data.table_sampler import TableSampler
from services.trainer.data.tables import claim_tables, table_name
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run.loop import TrainingLoop

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def address(tmp_path):
    settings = StoreSettings(port=0, data_dir=str(tmp_path / "data"), default_timeout_ms=2000)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        yield server.address


def _traj(episode: str, version: int = 0, group: str = "1", group_size: int | None = None) -> Trajectory:
    turn = Turn(
        step=0, prompt_token_ids=[1, 2], response_token_ids=[3, 4], response_logprobs=[-0.1, -0.2],
        policy_version=version, reward=0.0,
    )  # fmt: skip
    return Trajectory(
        episode_id=episode, agent_id="agent_1", policy_version=version, turns=[turn], group_id=group,
        episode_return=1.0, group_size=group_size or 0,
    )  # fmt: skip


def _direct(fn, what):
    return fn()


@dataclass
class Job:
    """One job's ends of its agents' tables (what TrainingLoop builds): the writer, the reader, and the learner's
    sampler that keeps what the reader takes (in the policy actor in a job; here in-process)."""

    writer: EpisodeWriter
    reader: BatchReader
    external: ExternalEpisodes
    dropped: int  # items earlier attempts left, dropped when the job claimed its tables
    sampler: TableSampler

    def insert_episode(self, *args, **kwargs):
        return self.writer.insert_episode(*args, **kwargs)

    def take(self, agent, *args, **kwargs):
        """The reader's take, with the trajectories the sampler kept for it (the ids the driver got name them
        in order); the take is then closed, as the loop's batch summary closes it."""
        taken = self.reader.take(agent, *args, **kwargs)
        trajectories = self.sampler.pending(agent)
        assert [t.episode_id for t in trajectories] == taken.item_ids
        self.sampler.summary(agent, 0)
        return SimpleNamespace(trajectories=trajectories, stale=taken.stale, dropped=taken.dropped)

    def runtime(self) -> SimpleNamespace:
        """What the loop's take needs of the runtime: the batch summary (of the in-process sampler)."""
        return SimpleNamespace(batch_summary=self.sampler.summary)


def _job(
    store, bounds: dict[str, int], max_size: int = 100, reconnecting=_direct, name: str = "job", sample=None
) -> Job:
    tables, dropped = claim_tables(store, name, bounds, max_size, reconnecting)
    external = ExternalEpisodes(list(bounds))
    writer = EpisodeWriter(store, tables, reconnecting, external)
    sampler = TableSampler(store)
    reader = BatchReader(sample or sampler.sample, tables, reconnecting, external)
    return Job(writer, reader, external, dropped, sampler)


def _feed(address: str, bound: int = 1) -> tuple[Job, ExperienceSharingClient]:
    client = ExperienceSharingClient("trainer", address, timeout_s=10)
    return _job(client, {"agent_1": bound}), client


def test_items_come_back_once_in_order_with_the_record_intact(address):
    feed, client = _feed(address)
    for i in range(4):
        feed.insert_episode({"agent_1": _traj(f"ep-{i}")})
    taken = feed.take("agent_1", 4, current_version=0)
    assert [t.episode_id for t in taken.trajectories] == [f"ep-{i}" for i in range(4)]
    t = taken.trajectories[0]
    assert t.turns[0].response_logprobs == pytest.approx([-0.1, -0.2]) and t.turns[0].policy_version == 0
    assert (t.group_id, t.episode_return) == ("1", 1.0)
    assert client.info("job/agent_1").size == 0
    with pytest.raises(FailedPreconditionError, match="holds 0 of the 1"):
        feed.take("agent_1", 1, current_version=0)  # no producer: a missing item is an error


def test_stale_items_are_removed_by_the_table_and_their_group_dropped_whole(address):
    feed, client = _feed(address, bound=1)
    batch = [
        _traj("a0", version=0, group="A", group_size=2),  # stale at version 2
        _traj("a1", version=1, group="A", group_size=2),  # fresh, but its group lost a member
        _traj("b0", version=1, group="B", group_size=2),
        _traj("b1", version=2, group="B", group_size=2),
    ]
    for t in batch:
        feed.insert_episode({"agent_1": t})
    taken = feed.take("agent_1", 4, current_version=2)
    assert [t.episode_id for t in taken.trajectories] == ["b0", "b1"]
    assert (taken.stale, taken.dropped) == (1, 1)
    assert client.info("job/agent_1").stale_removed == 1


def test_a_failed_attempts_episodes_and_a_retried_insert_never_reach_the_learner(address):
    """A rollout replayed after an outage deletes what its failed attempt inserted, and an insert retried after
    its answer was lost (the writer's own path: the store's idempotent insert) adds no second copy: the update
    takes each episode of the finished attempt once, and nothing else is left in the table."""
    feed, client = _feed(address)
    feed.writer.begin_attempt()
    feed.insert_episode({"agent_1": _traj("failed")})
    feed.writer.retract_attempt()  # the rollout is replayed after an outage
    assert client.info("job/agent_1").size == 0
    feed.writer.begin_attempt()
    feed.insert_episode({"agent_1": _traj("ok-0")})
    feed.insert_episode({"agent_1": _traj("ok-0")})  # an insert retried after a lost confirmation
    assert client.insert("job/agent_1", [_traj("failed")])[0].duplicate  # a late retry of the failed attempt
    feed.insert_episode({"agent_1": _traj("ok-1")})
    taken = feed.take("agent_1", 2, current_version=0)
    assert [t.episode_id for t in taken.trajectories] == ["ok-0", "ok-1"]
    assert client.info("job/agent_1").size == 0


def test_a_new_attempt_of_the_job_drops_what_an_interrupted_one_left(address):
    feed, _ = _feed(address)
    feed.insert_episode({"agent_1": _traj("left-over")})
    again, _ = _feed(address)
    assert again.writer.tables == again.reader.tables == {"agent_1": table_name("job", "agent_1")}
    assert again.dropped == 1
    again.insert_episode({"agent_1": _traj("new")})
    assert [t.episode_id for t in again.take("agent_1", 1, 0).trajectories] == ["new"]


def test_a_second_job_whose_clients_reuse_episode_ids_trains_on_every_episode(address):
    """The cause of the b699ecd revert: a job of the same training_name whose external clients count episode
    ids from 0 again had its episodes answered 'duplicate' by the store and silently never inserted. Each job
    claims its tables (a reset), so the second job's episodes all go in and are trained on."""
    first, _ = _feed(address)
    for i in range(3):
        first.insert_episode({"agent_1": _traj(f"ep-{i}", group="")}, external=True)
    assert len(first.take("agent_1", 3, 0, deadline=time.monotonic() + 5).trajectories) == 3
    second, client = _feed(address)
    for i in range(3):
        second.insert_episode({"agent_1": _traj(f"ep-{i}", group="")}, external=True)
    assert client.info("job/agent_1").size == 3
    taken = second.take("agent_1", 3, 0, deadline=time.monotonic() + 5)
    assert [t.episode_id for t in taken.trajectories] == ["ep-0", "ep-1", "ep-2"]


def test_items_of_a_group_without_a_size_are_taken_one_by_one(address):
    feed, _ = _feed(address)
    for i in range(2):
        feed.insert_episode({"agent_1": _traj(f"x{i}", group="A")})  # no size known: not held back
    assert [t.episode_id for t in feed.take("agent_1", 1, 0).trajectories] == ["x0"]
    assert [t.episode_id for t in feed.take("agent_1", 1, 0).trajectories] == ["x1"]


def test_an_update_of_external_episodes_takes_a_group_whole_when_its_batch_ends_inside_it(address):
    """Review finding: a lone episode (no group_size) before a group of 4 shifted the table, so an update of 4
    items took the lone one and 3 of the group, and the group's last member went to the next update."""
    feed, _ = _feed(address)
    feed.insert_episode({"agent_1": _traj("lone", group="")}, external=True)
    for i in range(4):
        feed.insert_episode({"agent_1": _traj(f"g{i}", group="G", group_size=4)}, external=True)
    for i in range(3):
        feed.insert_episode({"agent_1": _traj(f"h{i}", group="H", group_size=3)}, external=True)
    deadline = time.monotonic() + 10
    first = feed.take("agent_1", 4, current_version=0, deadline=deadline)
    assert [t.episode_id for t in first.trajectories] == ["lone", "g0", "g1", "g2", "g3"]
    assert (first.stale, first.dropped) == (0, 0)
    second = feed.take("agent_1", 3, current_version=0, deadline=deadline)
    assert [t.episode_id for t in second.trajectories] == ["h0", "h1", "h2"]


def test_a_group_whose_rest_has_not_come_is_never_trained_shrunk_and_waits_in_the_table(address):
    feed, client = _feed(address)
    for i in range(2):  # a group of 3 of which only 2 members reached the table so far
        feed.insert_episode({"agent_1": _traj(f"g{i}", group="G", group_size=3)}, external=True)
    feed.insert_episode({"agent_1": _traj("lone", group="")}, external=True)
    taken = feed.take("agent_1", 1, current_version=0, deadline=time.monotonic() + 10)
    # the update takes the lone episode; G is passed over whole, not trained shrunk, and kept
    assert [t.episode_id for t in taken.trajectories] == ["lone"]
    assert client.info("job/agent_1").size == 2 and feed.external.untaken() == 2
    feed.insert_episode({"agent_1": _traj("g2", group="G", group_size=3)}, external=True)
    taken = feed.take("agent_1", 3, current_version=0, deadline=time.monotonic() + 10)
    assert [t.episode_id for t in taken.trajectories] == ["g0", "g1", "g2"]
    assert (taken.stale, taken.dropped, feed.external.untaken()) == (0, 0, 0)


def test_an_external_process_inserts_trajectories_that_the_learner_trains_on(address, tmp_path):
    """The seam the inference gateway uses: any SDK client inserts records with behaviour log-probs and a
    policy version into an agent's table; the job's learner samples them and updates the agent with them."""
    from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
    from services.trainer.ray.table_access import StoreAccess

    cfg = load_config(
        ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path / 'run'}", "rollout.max_new_tokens=5"]
    )
    worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    chats = [[{"role": "user", "content": f"task {i}"}] for i in range(cfg.rollout.episodes_per_step)]
    gens = worker.generate("agent_1", chats)

    external = ExperienceSharingClient("my-agent", address, timeout_s=10)
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", address), show_progress=False)
    store = ExperienceSharingClient("trainer", address, timeout_s=10)
    access = StoreAccess(address)  # the policy actor takes its own batch (here the worker in-process)
    job = _job(
        store, {a: 0 for a in cfg.tuning_agents}, name=cfg.training_name,
        sample=lambda agent, table, n, version: worker.take_items(agent, table, n, version, access),
    )  # fmt: skip
    loop.writer, loop.reader = job.writer, job.reader
    for i, g in enumerate(gens):
        traj = Trajectory(
            episode_id=f"external-{i}", agent_id="agent_1", policy_version=0, group_id=str(i // 2),
            episode_return=float(i % 2),
            turns=[Turn(step=0, prompt_token_ids=list(g.prompt_token_ids), response_token_ids=list(g.response_token_ids),
                        response_logprobs=list(g.response_logprobs), policy_version=0)],
        )  # fmt: skip
        external.share_experience(traj, table=f"{cfg.training_name}/agent_1")
    for i in range(cfg.rollout.episodes_per_step):  # agent_2's table gets the job's own kind of items
        loop.writer.insert_episode(
            {"agent_2": _traj(f"own-{i}").__class__(episode_id=f"own-{i}", agent_id="agent_2")}
        )

    batches, metrics = loop._take_batches(worker, 0, {"agent_1": 0, "agent_2": 0})
    assert len(batches["agent_1"]) == len(gens) and metrics["agent_1/items"] == len(gens)
    trajectories = worker.pop_taken("agent_1", [r.index for r in batches["agent_1"]])
    logprobs = [turn.response_logprobs for t in trajectories for turn in t.turns]
    assert logprobs == [pytest.approx(list(g.response_logprobs)) for g in gens]
    assert batches["agent_2"] == []  # empty trajectories: the agent did not act

    before = {k: v.clone() for k, v in worker.policy.state_for_sync("agent_1").items()}
    stats = worker.train("agent_1", trajectories)
    assert stats["behaviour_rows"] == 1.0 and stats["behaviour_kl"] < 1e-9
    after = worker.policy.state_for_sync("agent_1")
    assert any(not torch.equal(before[k], after[k]) for k in before), "the external items were not trained on"
    for c in (external, store):
        c.close()


def test_an_empty_table_is_a_missing_item_not_a_service_outage(address):
    from services.trainer.job.connections.reconnect import Backoff, call_with_reconnect

    client = ExperienceSharingClient("trainer", address, timeout_s=10)
    # A real reconnect wrapper with a short outage limit: a wait for items must not be retried into an outage.
    feed = _job(
        client,
        {"agent_1": 1},
        reconnecting=lambda fn, what: call_with_reconnect(fn, what, Backoff(timeout_s=0.5)),
    )
    feed.insert_episode({"agent_1": _traj("only")})
    with pytest.raises(FailedPreconditionError, match="holds 1 of the 2 items"):
        feed.take("agent_1", 2, current_version=0)


def test_an_episode_cut_part_way_through_its_inserts_is_retracted_whole(address):
    from marti.errors import UnavailableError

    class Flaky:
        """The store client, except that inserts into agent_2's table fail (an outage outlasting the retries)."""

        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def insert(self, table, trajectories, timeout_s=None):
            if table.endswith("agent_2"):
                raise UnavailableError("store gone")
            return self.client.insert(table, trajectories, timeout_s=timeout_s)

    client = ExperienceSharingClient("trainer", address, timeout_s=10)
    feed = _job(Flaky(client), {"agent_1": 0, "agent_2": 0})
    feed.writer.begin_attempt()
    with pytest.raises(UnavailableError):
        feed.insert_episode({"agent_1": _traj("cut"), "agent_2": _traj("cut")})
    assert client.info("job/agent_1").size == 1
    feed.writer.retract_attempt()
    assert client.info("job/agent_1").size == 0  # the cut episode's item is deleted
    feed.writer.store = client  # the store is back; the rollout is replayed
    feed.writer.begin_attempt()
    feed.insert_episode({"agent_1": _traj("replayed"), "agent_2": _traj("replayed")})
    assert [t.episode_id for t in feed.take("agent_1", 1, 0).trajectories] == ["replayed"]


def test_a_stale_item_of_a_retracted_attempt_does_not_use_a_slot(address):
    feed, client = _feed(address, bound=0)
    feed.writer.begin_attempt()
    feed.insert_episode({"agent_1": _traj("failed", version=0)})
    feed.writer.retract_attempt()
    feed.writer.begin_attempt()
    for i in range(2):
        feed.insert_episode({"agent_1": _traj(f"ok-{i}", version=1)})
    taken = feed.take("agent_1", 2, current_version=1)  # "failed" would be stale, but it is deleted: no slot
    assert [t.episode_id for t in taken.trajectories] == ["ok-0", "ok-1"]
    assert (taken.stale, client.info("job/agent_1").stale_removed) == (0, 0)


def test_the_learner_takes_a_steps_items_only_after_its_rollout_is_over(tmp_path):
    """Asynchronous mode: an attempt that fails after some of its episodes were inserted is retracted before
    the learner reads the step, so no update trains on it."""
    cfg = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path / 'run'}"])
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", "unused:1"), show_progress=False)
    calls: list[str] = []

    class Producer:
        def summary(self, step):
            calls.append(f"summary {step}")
            return [], 1.0

    class Runtime:
        def versions(self):
            calls.append("versions")
            return {"agent_1": 0, "agent_2": 0}

    def take(runtime, step, versions):
        calls.append(f"take {step}")
        return {}, {}

    loop._take_batches = take
    loop._train_step(Runtime(), 3, Producer())
    assert calls == ["summary 3", "versions", "take 3"]


def test_an_episode_stopped_while_one_agents_table_is_full_is_in_no_table(address):
    """agent_2's table is full (the learner is behind on it), agent_1's has room; the gateway closes while the
    episode waits: neither table gets it, so the agents' tables stay aligned (the store's own table info)."""
    import threading

    from marti.errors import CancelledError

    client = ExperienceSharingClient("trainer", address, timeout_s=10)
    feed = _job(client, {"agent_1": 0, "agent_2": 0}, max_size=2)
    for i in range(2):
        client.share_experience(_traj(f"old-{i}"), table=table_name("job", "agent_2"), timeout_s=2)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(
        CancelledError, match="'job/agent_2' is full \\(2/2 items\\): stopped before any item"
    ):
        feed.insert_episode({"agent_1": _traj("new"), "agent_2": _traj("new")}, external=True, stop=stop)
    assert (client.info("job/agent_1").size, client.info("job/agent_2").size) == (0, 2)


def test_a_stale_external_episode_takes_no_slot_the_update_waits_for_a_fresh_one(address):
    """Issue 29 item 6: under max_staleness 0 an external episode sampled before the last update is removed by the
    table; it must not fill the update (which would then train on fewer items, or none, and still count): the
    update takes the next fresh one. Episodes inserted and never taken are counted (item 7)."""
    feed, client = _feed(address, bound=0)
    feed.insert_episode({"agent_1": _traj("old", version=0, group="")}, external=True)
    for i in range(3):
        feed.insert_episode({"agent_1": _traj(f"new{i}", version=1, group="")}, external=True)
    assert feed.external.untaken() == 4
    taken = feed.take("agent_1", 2, current_version=1, deadline=time.monotonic() + 10)
    assert [t.episode_id for t in taken.trajectories] == ["new0", "new1"]
    assert taken.stale == 1 and client.info("job/agent_1").stale_removed == 1
    assert feed.external.untaken() == 1  # new2: reported, never taken by an update


def test_an_external_episode_taken_the_moment_it_lands_is_not_counted_untaken(address):
    """The learner may take an external item before the insert call returns (it waits on the table): the feed
    must not then record it as still untaken (the job's last line said 'N reported episodes were never
    trained' for episodes an update had trained on)."""
    taken: list = []

    class TakenAtOnce:
        """The store client, except that the learner takes each item as soon as it lands."""

        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def insert(self, table, trajectories, timeout_s=None):
            result = self.client.insert(table, trajectories, timeout_s=timeout_s)
            taken.append(feed.take("agent_1", 1, current_version=0, deadline=time.monotonic() + 5))
            return result

    client = ExperienceSharingClient("trainer", address, timeout_s=10)
    feed = _job(TakenAtOnce(client), {"agent_1": 1})
    feed.insert_episode({"agent_1": _traj("ext-0")}, external=True)
    assert [t.episode_id for t in taken[0].trajectories] == ["ext-0"]
    assert feed.external.untaken() == 0


class _SoloEnv:
    """agent_1 answers once and the episode ends (reward 1.0 to agent_1, 0.5 to agent_2); agent_2 never acts."""

    possible_agents = ["agent_1", "agent_2"]
    metadata: dict = {}

    def __init__(self) -> None:
        self.agents: list[str] = []

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return dict.fromkeys(self.agents, "answer"), {"agent_1": {"is_acting": True}, "agent_2": {}}

    def step(self, actions):
        live, self.agents = self.agents, []
        return (
            dict.fromkeys(live, ""), {"agent_1": 1.0, "agent_2": 0.5}, dict.fromkeys(live, True),
            dict.fromkeys(live, False), dict.fromkeys(live, {}),
        )  # fmt: skip

    def close(self) -> None:
        pass


def test_the_runner_completes_each_record_once_and_an_idle_agents_item_is_not_stale(address, tmp_path):
    """A training rollout's records go to the tables as the runner finished them: each trainable agent gets one
    per episode (agent_2 never acts: a record without turns at the episode's version, so a synchronous job's
    bound of 0 does not remove it as stale), with the group, group size and credited return as typed fields."""
    from types import SimpleNamespace

    from services.trainer.rollout.episodes.runner import EpisodeRunner

    cfg = load_config(
        ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path / 'run'}", "reward_alloc.team_weight=2"]
    )
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", address), show_progress=False)
    store = ExperienceSharingClient("trainer", address, timeout_s=10)
    job = _job(store, {a: 0 for a in cfg.tuning_agents}, name=cfg.training_name)
    loop.writer, loop.reader = job.writer, job.reader
    gen = SimpleNamespace(
        text="42",
        prompt_token_ids=[1],
        response_token_ids=[2, 3],
        response_logprobs=[-0.1, -0.2],
        policy_version=3,
    )
    runner = EpisodeRunner(
        make_env=lambda seed: _SoloEnv(), generate=lambda agent, chats: [gen] * len(chats), comm_factory=None,
        agents=["agent_1", "agent_2"], roles={"agent_1": "planner", "agent_2": "executor"},
        system_prompts={"agent_1": "", "agent_2": ""}, policy_version=lambda a: 3, run_id="t",
        on_episode_end=loop._insert, records=loop._record_plan(),
    )  # fmt: skip
    results = runner.play([7, 7, 8, 8])
    batches, metrics = loop._take_batches(job.runtime(), 3, {"agent_1": 3, "agent_2": 3})
    assert metrics["agent_2/stale_dropped"] == 0 and metrics["agent_2/items"] == 4
    assert batches["agent_2"] == []  # the idle records were taken; nothing to train on
    taken = job.sampler.pop("agent_1", [r.index for r in batches["agent_1"]])
    assert [t.episode_id for t in taken] == [r.episode_id for r in results]
    assert [(t.group_id, t.group_size, t.episode_return, t.policy_version) for t in taken] == [
        (str(seed), 2, 2.0, 3) for seed in (7, 7, 8, 8)
    ]
    assert all(set(t.metadata) == {"seed"} for t in taken)  # no metadata copy of a typed field
    idle = results[0].trajectories["agent_2"]
    assert (idle.turns, idle.policy_version, idle.episode_return, idle.group_id) == ([], 3, 1.0, "7")
    store.close()
