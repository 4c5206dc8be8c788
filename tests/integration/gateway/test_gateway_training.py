"""The inference gateway in a training job: the server's two endpoints, and a job trained on external episodes.

An external client (a thread speaking plain HTTP, as any OpenAI client would) reads ``<run_dir>/gateway.json``,
checks that every agent's calls reach that agent's own policy, plays episodes with episode and group ids, reports
their rewards, and the job (``rollout.source: external``) trains its two trainable agents on exactly those
episodes while a frozen third agent keeps serving its unchanged weights.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import torch
import yaml

from marti.api.inference.v1 import inference_pb2 as pb
from marti.api.inference.v1 import inference_service_pb2_grpc as pb_grpc
from marti.config import config_from_dict
from marti.rpc.testing import serve_in_thread
from marti.types.inference import Generation, SamplingParams
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.job.cli.train_cli import untrained_note
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run.loop import TrainingLoop
from services.trainer.models.policy import MultiAgentPolicy
from services.trainer.ray.policy_worker import policy_layout
from services.trainer.rollout.engines.hf import HFRolloutEngine

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "gateway-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = [1, 9690, 28, 5248, 418, 253, 2365]  # token ids: the agents see the same prompt
STEPS = 2
EPISODES = 4  # external.episodes_per_step: two groups of two


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- the server
class _EchoBackend(InferenceBackend):
    """Two agents that answer with fixed tokens, for the server's plumbing."""

    def agents(self) -> list[str]:
        return ["a", "b"]

    def versions(self) -> dict[str, int]:
        return {"a": 3, "b": 0}

    def resident_versions(self, agent: str) -> list[int]:
        return [3] if agent == "a" else [0]

    def chat_prompt(self, agent, messages) -> list[int]:
        return [1, 2, 3]

    def encode(self, agent: str, text: str) -> list[int]:
        return [ord(c) for c in text]

    def token_texts(self, agent: str, ids) -> list[str]:
        return [chr(i) for i in ids]

    def decode(self, agent: str, ids) -> str:
        return "".join(chr(i) for i in ids)

    def vocab_size(self, agent: str) -> int:
        return 0x110000

    def max_model_len(self, agent: str) -> int:
        return 64

    def generate(self, agent, prompts, sampling, version) -> list[Generation]:
        v = self.versions()[agent]
        return [Generation(list(p), [7, 8], [-0.5, -0.25], "ok", "stop", v, agent) for p in prompts]


def test_server_serves_http_and_grpc_on_one_gateway_and_leaves_no_thread():
    before = set(threading.enumerate())
    released: list[dict] = []
    gateway = Gateway(_EchoBackend(), sink=released.append)
    http_port, grpc_port = _free_port(), _free_port()
    server = GatewayServer(gateway, host="127.0.0.1", http_port=http_port, grpc_port=grpc_port, token=TOKEN)
    try:
        http_url, grpc_address = server.start()
        assert (http_url, grpc_address) == (f"http://127.0.0.1:{http_port}/v1", f"127.0.0.1:{grpc_port}")
        with httpx.Client(base_url=http_url, headers=AUTH, timeout=30) as client:
            assert httpx.get(f"{http_url}/models", timeout=30).status_code == 401
            ids = [m["id"] for m in client.get("/models").json()["data"]]
            assert ids == ["a", "a@3", "b", "b@0"]
            body = {
                "model": "a",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
                "stop": [],
            }
            r = client.post("/chat/completions", json=body, headers={"X-Marti-Episode": "ep-1"})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == [7, 8] and r.json()["policy_version"] == 3
            r = client.post("/episodes/ep-1/reward", json={"rewards": {"a": 1.0}})  # b made no call
            assert r.json()["released"] == 1
        assert released and released[0]["a"].turns[0].response_token_ids == [7, 8]
        with grpc.insecure_channel(grpc_address) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as denied:
                stub.ListModels(pb.ListModelsRequest(), timeout=30)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
            meta = [("authorization", f"Bearer {TOKEN}")]
            assert [
                m.id for m in stub.ListModels(pb.ListModelsRequest(), metadata=meta, timeout=30).models
            ] == ids
            stats = stub.GetStats(pb.GetStatsRequest(), metadata=meta, timeout=30).counters
            assert stats["calls"] == 1 and stats["released"] == 1  # both endpoints share the one gateway
    finally:
        server.stop()
    assert not server.running
    # Nothing that would hold the interpreter at exit (grpc's process-wide poller is a daemon of its own).
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    ours = [t.name for t in left if not t.daemon or t.name.startswith("marti-gateway")]
    assert not ours, f"threads left running: {ours}"
    server.stop()  # idempotent


def test_without_an_explicit_token_both_endpoints_require_marti_token_or_serve_openly_without_it(monkeypatch):
    """A server given no token guards HTTP and gRPC alike with ``MARTI_TOKEN`` (what a job started without
    ``--token`` gets); with neither, both serve without authentication, like the other services."""
    monkeypatch.setenv("MARTI_TOKEN", "from-the-environment")
    with GatewayServer(Gateway(_EchoBackend())) as server:
        assert server.http_url is not None and server.grpc_address is not None
        assert httpx.get(f"{server.http_url}/models", timeout=30).status_code == 401
        assert httpx.get(f"{server.http_url}/models", headers=AUTH, timeout=30).status_code == 401
        env_auth = {"Authorization": "Bearer from-the-environment"}
        assert httpx.get(f"{server.http_url}/models", headers=env_auth, timeout=30).status_code == 200
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as denied:
                stub.ListModels(pb.ListModelsRequest(), timeout=30)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
            meta = [("authorization", "Bearer from-the-environment")]
            assert stub.ListModels(pb.ListModelsRequest(), metadata=meta, timeout=30).models
    monkeypatch.delenv("MARTI_TOKEN")
    with GatewayServer(Gateway(_EchoBackend())) as server:
        assert httpx.get(f"{server.http_url}/models", timeout=30).status_code == 200
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            assert stub.ListModels(pb.ListModelsRequest(), timeout=30).models


def test_http_and_grpc_requests_share_one_batch():
    """Requests of one agent over the two protocols meet in one engine call (a batch of 2 is full at once; had
    each protocol its own batcher, each request would wait out ``max_wait_ms`` and run alone). A third request
    is kept on its way throughout, so neither runs alone at once as a lone request would."""
    gateway = Gateway(_EchoBackend(), GatewayLimits(max_batch=2, max_wait_ms=20_000))
    out: dict[str, Any] = {}
    with GatewayServer(gateway, token=TOKEN) as server:

        async def on_its_way() -> None:
            with gateway.batcher.expecting():
                await asyncio.sleep(60)

        async def hold() -> asyncio.Task[None]:
            task = asyncio.ensure_future(on_its_way())
            await asyncio.sleep(0)  # it has entered expecting()
            return task

        held = server.run(hold())

        def over_http() -> None:
            body = {"model": "a", "prompt": "hi", "max_tokens": 2}
            out["http"] = httpx.post(f"{server.http_url}/completions", json=body, headers=AUTH, timeout=60)

        def over_grpc() -> None:
            with grpc.insecure_channel(server.grpc_address) as channel:
                req = pb.GenerateRequest(model="a", text="hi", max_tokens=2)
                meta = [("authorization", f"Bearer {TOKEN}")]
                out["grpc"] = pb_grpc.InferenceServiceStub(channel).Generate(req, metadata=meta, timeout=60)

        threads = [threading.Thread(target=over_http), threading.Thread(target=over_grpc)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert time.monotonic() - start < 15, "a request waited out max_wait_ms"
        assert out["http"].status_code == 200 and list(out["grpc"].choices[0].token_ids) == [7, 8]

        async def release() -> None:
            held.cancel()

        server.run(release())
    stats = gateway.stats()
    assert stats["batches"] == 1 and stats["batched_prompts"] == 2


def test_a_port_in_use_fails_the_start_with_the_address_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        server = GatewayServer(Gateway(_EchoBackend()), http_port=port)
        with pytest.raises(Exception, match=str(port)):
            server.start()
        server.stop()


# ---------------------------------------------------------------------------------------------- the job
@pytest.fixture
def store_address(tmp_path):
    settings = StoreSettings(port=0, data_dir=str(tmp_path / "store"), default_timeout_ms=2000)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        yield server.address


def _job_config(tmp_path: Path, http_port: int, grpc_port: int) -> Any:
    data = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    data["num_agents"] = 3
    data["agents"].append(
        {
            "name": "agent_3",
            "pretrain_model": "tiny-llama",
            "role": "critic",
            "num_cpus": 0.5,
            "is_tuning": False,
        }
    )
    return config_from_dict(
        data,
        [
            "policy.mode=per_agent",  # each agent its own model, seeded apart: different weights
            f"max_steps={STEPS}",
            "rollout.source=external",
            f"external.episodes_per_step={EPISODES}",
            "external.wait_timeout_s=240",
            "rollout.eval_every=0",
            "output.save_every=0",
            "gateway.resident_versions=3",
            f"gateway.http_port={http_port}",
            f"gateway.grpc_port={grpc_port}",
            "gateway.linger_s=120",  # the client reads the last version and the stats, then stops the job
            f"output.dir={tmp_path / 'run'}",
        ],
        unset=("policy.lora_r", "policy.lora_alpha"),  # tiny.yaml's LoRA keys: no adapters in per_agent mode
    )


def _greedy_reference(cfg: Any) -> dict[str, Generation]:
    """Each agent's greedy answer to PROMPT with its initial weights, from an engine of this process."""
    out = {}
    for agent in ("agent_1", "agent_2", "agent_3"):
        policy = MultiAgentPolicy(policy_layout(cfg, [agent]), device="cpu")
        engine = HFRolloutEngine.from_policy(policy, copy_weights=False)
        with torch.no_grad():
            out[agent] = engine.generate(agent, [PROMPT], SamplingParams(max_new_tokens=6, temperature=0.0))[
                0
            ]
    return out


class _ExternalClient:
    """External agent code: greedy routing checks, then STEPS rounds of EPISODES episodes over plain HTTP."""

    def __init__(self, run_dir: Path, reference: dict[str, Generation], stop: threading.Event) -> None:
        self.run_dir, self.reference, self.stop = run_dir, reference, stop
        self.error: str | None = None
        self.seen: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._main, name="external-client", daemon=True)

    def _main(self) -> None:
        try:
            self._play()
        except BaseException:  # noqa: BLE001 - reported by the test
            self.error = traceback.format_exc()
            self.stop.set()  # the job stops waiting for episodes that will not come

    def _greedy(self, http: httpx.Client, model: str) -> dict[str, Any]:
        body = {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": 6,
            "temperature": 0.0,
            "logprobs": 1,
            "stop": [],
        }
        r = http.post("/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def _versions(self, http: httpx.Client) -> dict[str, int]:
        return {
            m["id"]: m["policy_version"] for m in http.get("/models").json()["data"] if "@" not in m["id"]
        }

    def _play(self) -> None:
        path = self.run_dir / "gateway.json"
        deadline = time.monotonic() + 300
        while not path.exists():
            assert time.monotonic() < deadline, "the job never wrote gateway.json"
            time.sleep(0.2)
        info = json.loads(path.read_text())
        self.seen["gateway.json"] = info
        assert httpx.get(f"{info['http']}/models", timeout=30).status_code == 401
        with httpx.Client(base_url=info["http"], headers=AUTH, timeout=120) as http:
            # Bad requests get their documented errors; the job serves on (and trains below).
            msg = [{"role": "user", "content": "hi"}]
            bad = http.post("/chat/completions", json={"model": "nobody", "messages": msg})
            assert bad.status_code == 404 and bad.json()["error"]["type"] == "not_found_error", bad.text
            long = {"model": "agent_1", "prompt": [5] * 4096, "max_tokens": 2}
            bad = http.post("/completions", json=long)
            assert bad.status_code == 400 and "context" in bad.json()["error"]["message"], bad.text
            bad = http.post("/episodes/never-played/reward", json={"rewards": {"agent_1": 1.0}})
            assert bad.status_code == 404 and bad.json()["error"]["code"] == "not_found", bad.text
            # Routing: each agent's calls reach its own policy.
            first = {a: self._greedy(http, a) for a in self.reference}
            for agent, got in first.items():
                want = self.reference[agent]
                assert got["agent"] == agent and got["policy_version"] == 0
                assert got["choices"][0]["token_ids"] == want.response_token_ids, agent
                logps = got["choices"][0]["logprobs"]["token_logprobs"]
                assert logps == pytest.approx(want.response_logprobs, abs=1e-4)
            # The tiny random models may all repeat a token greedily; their distributions still differ.
            answers = {a: (tuple(g["choices"][0]["token_ids"]), tuple(g["choices"][0]["logprobs"]["token_logprobs"]))
                       for a, g in first.items()}  # fmt: skip
            for a, b in (("agent_1", "agent_2"), ("agent_1", "agent_3"), ("agent_2", "agent_3")):
                assert (
                    answers[a][0] != answers[b][0]
                    or max(abs(x - y) for x, y in zip(answers[a][1], answers[b][1], strict=True)) > 1e-3
                ), f"{a} and {b} answer alike: {answers}"
            # Item 6 of issue 29: an episode played before the first update and reported after it is already
            # past the bound (rollout.max_staleness 0): the report says so, and the update after it waits for
            # fresh episodes instead of counting the removed one.
            self._episode(http, "late", "late-g", reward=1.0, report=False)
            for step in range(STEPS):
                for e in range(EPISODES):
                    self._episode(http, f"s{step}-e{e}", f"s{step}-g{e // 2}", reward=float(e % 2))
                deadline = time.monotonic() + 240
                while (
                    self._versions(http)["agent_1"] < step + 1 or self._versions(http)["agent_2"] < step + 1
                ):
                    assert time.monotonic() < deadline and not self.stop.is_set(), "no update came"
                    time.sleep(0.2)
                if step == 0:
                    self.seen["late"] = self._report(http, "late", "late-g", 1.0)
                    # Training agent_1 and agent_2 left the frozen agent_3 as it was; agent_1's first weights
                    # are still servable as agent_1@0.
                    versions = self._versions(http)
                    assert versions == {"agent_1": 1, "agent_2": 1, "agent_3": 0}
                    # gateway.json follows the syncs: it lists what /models serves now
                    served = [m["id"] for m in http.get("/models").json()["data"]]
                    listed, until = json.loads(path.read_text())["models"], time.monotonic() + 10
                    while listed != served and time.monotonic() < until:  # written just after the sync
                        time.sleep(0.1)
                        listed = json.loads(path.read_text())["models"]
                    assert "agent_1@1" in served and listed == served, (listed, served)
                    again = self._greedy(http, "agent_3")
                    assert again["choices"][0]["token_ids"] == first["agent_3"]["choices"][0]["token_ids"]
                    assert again["choices"][0]["logprobs"] == first["agent_3"]["choices"][0]["logprobs"]
                    pinned = self._greedy(http, "agent_1@0")
                    assert pinned["policy_version"] == 0
                    assert pinned["choices"][0]["token_ids"] == first["agent_1"]["choices"][0]["token_ids"]
                    now = self._greedy(http, "agent_1")  # ... while agent_1's own weights did move
                    assert now["policy_version"] == 1
                    before = first["agent_1"]["choices"][0]["logprobs"]["token_logprobs"]
                    after = now["choices"][0]["logprobs"]["token_logprobs"]
                    assert (
                        now["choices"][0]["token_ids"] != first["agent_1"]["choices"][0]["token_ids"]
                        or max(abs(x - y) for x, y in zip(before, after, strict=True)) > 1e-6
                    )
            # Item 7: an episode reported after the last update (during the linger) is accepted and never trained.
            self._episode(http, "after-last", "after-g", reward=1.0)
            self.seen["stats"] = http.get("/gateway/stats").json()
        with grpc.insecure_channel(info["grpc"]) as channel:  # the gRPC endpoint serves the same gateway
            meta = [("authorization", f"Bearer {TOKEN}")]
            models = pb_grpc.InferenceServiceStub(channel).ListModels(pb.ListModelsRequest(), metadata=meta)
            self.seen["grpc_models"] = [m.id for m in models.models]
        self.stop.set()  # ends the job's linger: everything was read while the gateway served

    def _episode(
        self, http: httpx.Client, episode: str, group: str, reward: float, report: bool = True
    ) -> None:
        """Every agent acts once (sampled, recorded), then (``report``) the client reports each trained agent's
        reward."""
        ids = {"X-Marti-Episode": episode, "X-Marti-Group": group}
        for agent in ("agent_1", "agent_2", "agent_3"):
            body = {
                "model": agent,
                "messages": [{"role": "user", "content": f"{episode}: your move, {agent}"}],
                "max_tokens": 4,
                "temperature": 1.0,
                "stop": [],
            }
            r = http.post("/chat/completions", json=body, headers=ids)
            assert r.status_code == 200, r.text
        if report:
            self._report(http, episode, group, reward, size=2 if group.startswith("s") else 0)

    @staticmethod
    def _report(http: httpx.Client, episode: str, group: str, reward: float, size: int = 0) -> dict[str, Any]:
        rewards = {"agent_1": reward, "agent_2": 1.0 - reward}
        r = http.post(
            f"/episodes/{episode}/reward", json={"rewards": rewards, "group_id": group, "group_size": size}
        )
        assert r.status_code == 200, r.text
        return r.json()


@pytest.mark.slow
def test_a_job_trains_its_agents_on_episodes_external_clients_played_through_the_gateway(
    tmp_path, store_address, capsys, caplog
):
    http_port, grpc_port = _free_port(), _free_port()
    cfg = _job_config(tmp_path, http_port, grpc_port)
    assert cfg.gateway.enabled and cfg.tuning_agents == ["agent_1", "agent_2"]
    reference = _greedy_reference(cfg)
    stop = threading.Event()
    client = _ExternalClient(cfg.run_dir, reference, stop)
    client.thread.start()
    loop = TrainingLoop(
        cfg,
        Addresses("unused:1", "unused:1", store_address, token=TOKEN),
        stop_event=stop,
        show_progress=False,
    )
    try:
        summary = loop.run()
    finally:
        stop.set()
        client.thread.join(60)
    assert client.error is None, client.error
    assert summary.steps == STEPS and not summary.stopped
    # the late episode's report said it is stale (its calls' version 0, the agents at 1, bound 0)
    stale = {s["agent"]: s for s in client.seen["late"]["stale"]}
    assert set(stale) == {"agent_1", "agent_2"}, client.seen["late"]
    assert stale["agent_1"] == {"episode_id": "late", "agent": "agent_1", "policy_version": 0,
                                "current_version": 1, "max_staleness": 0, "stale_calls": 1}  # fmt: skip
    # the episode reported during the linger was never trained: counted and warned about
    assert summary.untrained_external == 1
    assert any("1 reported episodes were never trained" in r.getMessage() for r in caplog.records)
    assert untrained_note(summary.untrained_external).startswith("; 1 reported episode was never trained")

    info = client.seen["gateway.json"]
    listening = f"gateway listening on http://127.0.0.1:{http_port}/v1 (gRPC 127.0.0.1:{grpc_port})"
    assert listening in capsys.readouterr().out.splitlines()
    assert (info["http"], info["grpc"]) == (f"http://127.0.0.1:{http_port}/v1", f"127.0.0.1:{grpc_port}")
    assert info["models"][:2] == ["agent_1", "agent_1@0"] and "agent_3" in info["models"]
    assert client.seen["grpc_models"][0] == "agent_1"
    assert not (cfg.run_dir / "gateway.json").exists(), "gateway.json outlived the gateway"

    records = [
        json.loads(line)["metrics"] for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(records) == STEPS
    for step, m in enumerate(records, start=1):
        for agent in ("agent_1", "agent_2"):
            assert m[f"{agent}/items"] == EPISODES and m[f"{agent}/external_items"] == EPISODES
            assert m[f"{agent}/policy_version"] == float(step)  # trained on them: the version advanced
            # update 2 met the late episode first: removed as stale, it took no slot (4 fresh ones trained)
            assert (
                m[f"{agent}/stale_dropped"] == (1 if step == 2 else 0) and m[f"{agent}/version_lag_max"] == 0
            )
        assert m["agent_1/external_reward"] == 0.5 and "agent_3/items" not in m
        assert m["gateway/released"] >= EPISODES * step and m["gateway/dropped"] == 0
        assert m["external/waiting_episodes"] == 0
        assert m["gateway/abandoned"] == 0 and m["gateway/failed"] == 0 and "gateway/open_episodes" in m
    assert records[-1]["gateway/released"] == EPISODES * STEPS + 1  # and the late one
    assert records[-1]["gateway/stale_reported"] == 1
    assert client.seen["stats"]["calls"] == 3 * (EPISODES * STEPS + 2)  # every agent's calls were traced
