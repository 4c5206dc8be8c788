#!/usr/bin/env node
'use strict';
/**
 * External marti agent in Node.js: the executor of a resource_allocation team whose leader is a Python agent
 * (examples/node_agent/partner.py).
 *
 *   1. ListEnvs, then CreateSession(collaborative_task_solving, scenario=resource_allocation, 2 agents) and Reset
 *      on env_server;
 *   2. tells the Python leader the env session id through comm_broker (a zstd batch of two envelopes);
 *   3. plays the episode in that one env session: the leader steps its own turns, the Node agent steps its own,
 *      and each side passes the next observation to the other through the broker (both directions decoded and
 *      checked by SHA-256 of every payload);
 *   4. shares its trajectory through experience_store (Insert stream) and reads the Python agent's back
 *      (GetAllExperiences);
 *   5. prints one JSON summary line on stdout (the integration test reads it) and exits 0, or exits 1 with the
 *      error on stderr.
 *
 * With --gateway (or MARTI_GATEWAY_ADDRESS) the executor's actions come from an LLM policy served by a marti
 * inference gateway instead of the scripted policy: each turn is one InferenceService.Generate call carrying the
 * episode id (the gateway records its exact tokens and log-probabilities), its completion is the action as it
 * is, and once the episode ends ReportReward sends each call's step reward and the return, which releases the
 * episode to training (lib/gateway.js). Everything else is unchanged.
 *
 * Usage: node agent.js --env HOST:PORT --broker HOST:PORT --store HOST:PORT --session NAME
 *          [--token T] [--proto-root DIR] [--proto-include DIR ...] [--seed N] [--timeout-s S]
 *          [--gateway HOST:PORT [--model NAME] [--gateway-token T] [--max-tokens N] [--temperature X]]
 *
 * --model defaults to the agent id; --gateway-token to MARTI_GATEWAY_TOKEN, then --token.
 */

const crypto = require('node:crypto');
const path = require('node:path');
const m = require('./lib/marti');
const policy = require('./lib/policy');
const { GatewayPolicy, loadInference } = require('./lib/gateway');

const ENV_ID = 'collaborative_task_solving';
const JSON_TYPE = 'application/json';

/**
 * Parse command-line flags (every flag takes one value; --proto-include may repeat).
 * @param {string[]} argv - process.argv.slice(2).
 * @returns {object} Options.
 */
function parseArgs(argv) {
  const opts = {
    protoRoot: path.resolve(__dirname, '..', '..', 'protos'),
    protoInclude: [],
    token: process.env.MARTI_TOKEN || undefined,
    agent: 'agent_2',
    partner: 'agent_1',
    seed: 7,
    timeoutS: 60,
    gateway: process.env.MARTI_GATEWAY_ADDRESS || undefined,
    gatewayToken: process.env.MARTI_GATEWAY_TOKEN || undefined,
    model: undefined,
    maxTokens: 48,
    temperature: 1.0,
  };
  const names = {
    '--env': 'env', '--broker': 'broker', '--store': 'store', '--session': 'session', '--token': 'token',
    '--proto-root': 'protoRoot', '--seed': 'seed', '--timeout-s': 'timeoutS', '--agent': 'agent',
    '--partner': 'partner', '--gateway': 'gateway', '--gateway-token': 'gatewayToken', '--model': 'model',
    '--max-tokens': 'maxTokens', '--temperature': 'temperature',
  };
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`flag ${flag} needs a value`);
    if (flag === '--proto-include') opts.protoInclude.push(value);
    else if (names[flag]) opts[names[flag]] = value;
    else throw new Error(`unknown flag ${flag}`);
  }
  for (const k of ['env', 'broker', 'store', 'session']) {
    if (!opts[k]) throw new Error(`--${k} is required`);
  }
  opts.seed = Number(opts.seed);
  opts.timeoutS = Number(opts.timeoutS);
  if (!Number.isInteger(opts.seed)) throw new Error(`--seed must be an integer, got ${opts.seed}`);
  if (!(opts.timeoutS > 0)) throw new Error(`--timeout-s must be > 0, got ${opts.timeoutS}`);
  opts.maxTokens = Number(opts.maxTokens);
  opts.temperature = Number(opts.temperature);
  if (!(Number.isInteger(opts.maxTokens) && opts.maxTokens > 0)) {
    throw new Error(`--max-tokens must be an integer > 0, got ${opts.maxTokens}`);
  }
  if (!(opts.temperature >= 0)) throw new Error(`--temperature must be >= 0, got ${opts.temperature}`);
  opts.model = opts.model || opts.agent;
  opts.gatewayToken = opts.gatewayToken || opts.token;
  return opts;
}

const sha256 = (buf) => crypto.createHash('sha256').update(buf).digest('hex');

/** Broker side of the agent: batched zstd sends, long-poll receives with piggy-backed acks. */
class Comm {
  constructor(api, address, md, session, agent) {
    this.api = api;
    this.stub = new api.broker(address, m.grpc.credentials.createInsecure());
    this.md = md;
    this.session = session;
    this.agent = agent;
    this.seq = 0;
    this.pendingAcks = [];
    this.inbox = [];
    this.sentDigests = [];
    this.receivedDigests = [];
    this.framesSent = { CODEC_ZSTD: 0, CODEC_NONE: 0 };
    this.framesReceived = { CODEC_ZSTD: 0, CODEC_NONE: 0 };
    this.bytes = { sentRaw: 0, sentWire: 0, receivedRaw: 0, receivedWire: 0 };
  }

  async open(agents) {
    return m.unary(this.stub, 'CreateSession', { session: this.session, agents }, this.md);
  }

  /** Send JSON messages to one receiver as ONE batch (one frame). Returns the broker's SendResponse. */
  async send(receiver, messages) {
    const envelopes = messages.map((msg) => {
      const payload = Buffer.from(JSON.stringify(msg), 'utf8');
      this.sentDigests.push(sha256(payload));
      this.seq += 1;
      return {
        message_id: crypto.randomUUID(),
        sender: this.agent,
        receivers: [receiver],
        sequence: this.seq,
        sent_at_unix_us: Date.now() * 1000,
        content_type: JSON_TYPE,
        payload,
      };
    });
    const frame = m.encodeFrame(this.api.root, envelopes);
    this.framesSent[frame.codec] += 1;
    this.bytes.sentRaw += frame.uncompressed_bytes;
    this.bytes.sentWire += frame.data.length;
    const req = { session: this.session, sender: this.agent, frame };
    const resp = await m.unary(this.stub, 'Send', req, this.md);
    if (resp.accepted !== envelopes.length) {
      throw new Error(`broker accepted ${resp.accepted} of ${envelopes.length} envelopes`);
    }
    return resp;
  }

  /** Wait (long polls of at most 1 s) until a message of `type` arrives; returns its parsed JSON. */
  async expect(type, deadlineMs) {
    for (;;) {
      const i = this.inbox.findIndex((x) => x.type === type);
      if (i >= 0) return this.inbox.splice(i, 1)[0];
      const left = deadlineMs - Date.now();
      if (left <= 0) throw new Error(`no '${type}' message from the partner before the deadline`);
      const acks = this.pendingAcks.splice(0);
      const req = {
        session: this.session,
        agent_id: this.agent,
        max_messages: 64,
        timeout_ms: Math.min(1000, left),
        ack_message_ids: acks,
        accept_codec: 'CODEC_ZSTD',
      };
      const resp = await m.unary(this.stub, 'Receive', req, this.md, Math.min(1000, left) + 30000);
      if (resp.frame && resp.count > 0) {
        this.framesReceived[resp.frame.codec] += 1;
        this.bytes.receivedRaw += Number(resp.frame.uncompressed_bytes);
        this.bytes.receivedWire += resp.frame.data.length;
      }
      for (const env of m.decodeFrame(this.api.root, resp.frame)) {
        this.pendingAcks.push(env.message_id);
        if (env.content_type.split(';')[0].trim() !== JSON_TYPE) {
          throw new Error(`unexpected content type ${env.content_type}`);
        }
        this.receivedDigests.push(sha256(env.payload));
        this.inbox.push(JSON.parse(env.payload.toString('utf8')));
      }
    }
  }

  async flushAcks() {
    const ids = this.pendingAcks.splice(0);
    if (ids.length) await m.unary(this.stub, 'Ack', { session: this.session, agent_id: this.agent, message_ids: ids }, this.md);
  }

  close() {
    this.stub.close();
  }
}

/** Insert one typed trajectory over the Insert bidi stream; resolves with the item key. */
function insertTrajectory(stub, md, trajectory, timeoutMs) {
  return new Promise((resolve, reject) => {
    const call = stub.Insert(md, { deadline: Date.now() + timeoutMs });
    let key = null;
    call.on('data', (resp) => {
      const c = resp.confirmations[0];
      if (c.status && c.status.code) reject(new Error(`insert refused: ${c.status.code} ${c.status.message}`));
      else key = Number(c.key);
      call.end();
    });
    call.on('error', reject);
    call.on('end', () => (key === null ? reject(new Error('insert stream ended without a confirmation')) : resolve(key)));
    call.write({ items: [{ table: '', priority: 1.0, trajectory, client_seq: 1 }], timeout_ms: timeoutMs });
  });
}

/** Read every stored item of an episode (typed) over the GetAllExperiences server stream. */
function readEpisode(stub, md, episodeId, timeoutMs) {
  return new Promise((resolve, reject) => {
    const items = [];
    const call = stub.GetAllExperiences({ episode_id: episodeId, format: 'PAYLOAD_FORMAT_TYPED' }, md, {
      deadline: Date.now() + timeoutMs,
    });
    call.on('data', (resp) => items.push(...resp.items));
    call.on('error', reject);
    call.on('end', () => resolve(items));
  });
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  await m.initZstd();
  const api = m.loadApi(opts.protoRoot, opts.protoInclude);
  const md = m.authMetadata(opts.token);
  const deadline = Date.now() + opts.timeoutS * 1000;
  const creds = m.grpc.credentials.createInsecure();
  const env = new api.env(opts.env, creds);
  const store = new api.experience(opts.store, creds);
  const comm = new Comm(api, opts.broker, md, opts.session, opts.agent);
  const episodeId = `node-${crypto.randomUUID()}`;
  let llm = null; // the gateway's policy, when --gateway is given
  if (opts.gateway) {
    const Inference = loadInference(opts.protoRoot, opts.protoInclude);
    llm = new GatewayPolicy(Inference, opts.gateway, m.authMetadata(opts.gatewayToken), {
      model: opts.model,
      agent: opts.agent,
      episodeId,
      maxTokens: opts.maxTokens,
      temperature: opts.temperature,
      timeoutMs: 30000,
    });
    await llm.check();
  }

  // 1. discover environments and create the shared env session
  const listed = await m.unary(env, 'ListEnvs', {}, md);
  const envIds = listed.envs.map((e) => e.env_id);
  if (!listed.envs.some((e) => e.name === ENV_ID)) throw new Error(`${ENV_ID} not in ${envIds}`);
  const config = { scenario: 'resource_allocation', num_agents: 2, observation_format: 'json', max_turns: 8 };
  const created = await m.unary(env, 'CreateSession', {
    env_id: ENV_ID,
    config: m.toValue(config).map,
    seed: opts.seed,
    request_id: crypto.randomUUID(),
  }, md);
  const roles = Object.fromEntries(created.agents.map((a) => [a.agent, a.role]));
  if (roles[opts.agent] !== 'executor' || roles[opts.partner] !== 'leader') {
    throw new Error(`unexpected roles ${JSON.stringify(roles)}`);
  }
  let state = m.parseStep(await m.unary(env, 'Reset', { session_id: created.session_id, request_id: crypto.randomUUID() }, md));

  // 2. invite the Python leader: one zstd batch of two envelopes
  await comm.open([opts.agent, opts.partner]);
  await comm.send(opts.partner, [
    { type: 'join', env_session_id: created.session_id, env_id: created.env_id, episode_id: episodeId, you: opts.partner, roles },
    { type: 'observation', agent: opts.partner, observation: state.observations[opts.partner], acting: state.acting },
  ]);

  // 3. play: wait for the leader's plan and my observation, act, report back, until the episode ends
  const turns = [];
  let plan = null;
  let done = false;
  let followedPlan = false;
  let verifiedByPartner = 0;
  while (!done) {
    const planMsg = await comm.expect('plan', deadline);
    const turnMsg = await comm.expect('your_turn', deadline);
    for (const d of turnMsg.received_sha256) {
      if (!comm.sentDigests.includes(d)) throw new Error(`partner reports a digest I never sent: ${d}`);
      verifiedByPartner += 1;
    }
    if (turnMsg.done) break;
    plan = planMsg.plan;
    const obs = turnMsg.observation;
    const doc = JSON.parse(obs);
    if (!doc.your_turn) throw new Error(`not my turn: acting ${doc.acting_agent}`);
    const action = llm ? { ...(await llm.act(obs, plan)), followedPlan: false } : policy.act(doc.problem, plan);
    followedPlan = action.followedPlan;
    const step = m.parseStep(await m.unary(env, 'Step', {
      session_id: created.session_id,
      actions: [{ agent: opts.agent, action: m.toValue(action.text) }],
      request_id: crypto.randomUUID(),
    }, md));
    done = step.agents.length === 0;
    const info = step.infos[opts.agent];
    turns.push({
      step: doc.turn,
      prompt_text: obs,
      response_text: action.text,
      reward: step.rewards[opts.agent],
      terminated: step.terminations[opts.agent],
      truncated: step.truncations[opts.agent],
      info_json: JSON.stringify({ valid_allocation: info.valid_allocation, team_score: info.team_score }),
    });
    await comm.send(opts.partner, [
      {
        type: 'result',
        done,
        rewards: step.rewards,
        terminations: step.terminations,
        truncations: step.truncations,
        infos: step.infos,
        observation: done ? null : step.observations[opts.partner],
        received_sha256: comm.receivedDigests,
      },
    ]);
    state = step;
  }

  // with a gateway: end the recorded episode with each call's step reward (releases it to training)
  const gatewayReport = llm ? await llm.report(turns.map((t) => t.reward)) : null;

  // 4. share my trajectory, tell the partner, read the partner's trajectory back
  const trajectory = {
    episode_id: episodeId,
    session: created.session_id,
    agent_id: opts.agent,
    role: roles[opts.agent],
    policy_version: 0,
    turns,
    metadata_json: JSON.stringify({
      language: 'javascript',
      runtime: `node ${process.version}`,
      policy: llm ? `gateway:${opts.model}` : 'scripted',
    }),
    created_at_s: Date.now() / 1000,
  };
  const key = await insertTrajectory(store, md, trajectory, 30000);
  await comm.send(opts.partner, [{ type: 'shared', key, episode_id: episodeId, num_turns: turns.length }]);
  const partnerShared = await comm.expect('partner_shared', deadline);
  await comm.flushAcks();
  const items = await readEpisode(store, md, episodeId, 30000);
  const partnerItem = items.find((it) => it.trajectory && it.trajectory.agent_id === opts.partner);
  if (!partnerItem) throw new Error(`partner trajectory not in the store (items: ${items.length})`);
  if (partnerItem.trajectory.turns.length !== partnerShared.num_turns) {
    throw new Error(`partner trajectory has ${partnerItem.trajectory.turns.length} turns, expected ${partnerShared.num_turns}`);
  }
  await m.unary(comm.stub, 'PutState', {
    session: opts.session, agent_id: opts.agent, content_type: JSON_TYPE,
    value: Buffer.from(JSON.stringify({ role: 'executor', episode_id: episodeId, done: true })),
  }, md);
  const closed = await m.unary(env, 'CloseSession', { session_id: created.session_id }, md);

  const summary = {
    ok: true,
    env_ids: envIds,
    env_session_id: created.session_id,
    episode_id: episodeId,
    trajectory_key: key,
    node_turns: turns.length,
    actions: turns.map((t) => t.response_text),
    rewards: turns.map((t) => t.reward),
    followed_plan: followedPlan,
    final_infos: state.infos,
    partner_key: Number(partnerItem.key),
    partner_turns: partnerItem.trajectory.turns.length,
    sent_sha256: comm.sentDigests,
    received_sha256: comm.receivedDigests,
    verified_by_partner: verifiedByPartner,
    frames_sent: comm.framesSent,
    frames_received: comm.framesReceived,
    bytes: comm.bytes,
    env_closed: closed.closed,
    policy: llm ? 'gateway' : 'scripted',
  };
  if (llm) {
    summary.gateway = { model: opts.model, models: llm.models, calls: llm.calls, ...gatewayReport };
    llm.close();
  }
  comm.close();
  env.close();
  store.close();
  process.stdout.write(`${JSON.stringify(summary)}\n`);
}

main().catch((err) => {
  const code = err && err.code !== undefined ? ` (grpc code ${err.code})` : '';
  process.stderr.write(`node agent failed${code}: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
