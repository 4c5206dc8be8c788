'use strict';
/**
 * The executor's policy served by a marti inference gateway (marti.api.inference.v1.InferenceService), written
 * from the .proto files only, like lib/marti.js.
 *
 * Each turn asks the gateway for one completion of a chat conversation (an instruction and the JSON observation
 * with the leader's plan) under the episode's id, so the gateway records the call with its exact token ids and
 * log-probabilities; the completion's text is the action, as it is. When the episode ends, `report` sends the
 * per-turn rewards (per call id) and the episode return with ReportReward, which hands the recorded calls to
 * training.
 */

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const m = require('./marti');

/** The inference service's proto file, relative to the proto root. */
const PROTO_FILE = 'marti/api/inference/v1/inference_service.proto';

/** What the model is told its job is (the user message carries the observation and the plan). */
const INSTRUCTION =
  'You are the executor of a resource allocation team. Reply with one line per task, "task_name: units", ' +
  'and nothing else. Keep every resource capacity, min/max unit and exclusive-pair constraint.';

/**
 * Load the InferenceService client constructor.
 * @param {string} protoRoot - Folder holding marti/api/... (the repository's protos/).
 * @param {string[]} includeDirs - Extra import roots.
 * @returns {Function} The InferenceService client constructor.
 */
function loadInference(protoRoot, includeDirs = []) {
  const options = { ...m.LOADER_OPTIONS, includeDirs: [protoRoot, ...includeDirs] };
  const def = protoLoader.loadSync([PROTO_FILE], options);
  return grpc.loadPackageDefinition(def).marti.api.inference.v1.InferenceService;
}

/** One agent's policy behind the gateway, for one episode. */
class GatewayPolicy {
  /**
   * @param {Function} Service - From loadInference.
   * @param {string} address - host:port of the gateway's gRPC endpoint.
   * @param {grpc.Metadata} md - Metadata with the gateway's bearer token (or none).
   * @param {{model: string, agent: string, episodeId: string, maxTokens: number, temperature: number,
   *   timeoutMs: number}} opts - Model name (an agent id or AGENT@VERSION), the trained agent the rewards
   *   credit, the episode id every call carries, sampling and the deadline of each call (milliseconds).
   */
  constructor(Service, address, md, opts) {
    this.stub = new Service(address, grpc.credentials.createInsecure());
    this.md = md;
    this.opts = opts;
    this.calls = []; // {call_id, tokens, finish_reason, policy_version, text}
    this.models = [];
  }

  /** ListModels: fails early (NOT_FOUND-like error) when the gateway does not serve `opts.model`. */
  async check() {
    const resp = await m.unary(this.stub, 'ListModels', {}, this.md, this.opts.timeoutMs);
    this.models = (resp.models || []).map((x) => x.id);
    if (!this.models.includes(this.opts.model)) {
      throw new Error(`the gateway does not serve model ${this.opts.model}; it serves ${this.models}`);
    }
  }

  /**
   * One recorded call: the completion of the instruction plus the observation and the plan.
   * @param {string} observation - The env's JSON observation text.
   * @param {object|null} plan - The leader's plan (task -> units), or null.
   * @returns {Promise<{text: string, callId: string}>} The action text (the completion) and its call id.
   */
  async act(observation, plan) {
    const user = `${observation}\n\nThe leader's plan: ${JSON.stringify(plan)}`;
    const req = {
      model: this.opts.model,
      messages: { messages: [{ role: 'system', content: INSTRUCTION }, { role: 'user', content: user }] },
      max_tokens: this.opts.maxTokens,
      temperature: this.opts.temperature,
      n: 1,
      episode_id: this.opts.episodeId,
    };
    const resp = await m.unary(this.stub, 'Generate', req, this.md, this.opts.timeoutMs);
    const c = resp.choices[0];
    const tokens = (c.token_ids || []).length;
    const logprobs = (c.logprobs || []).length;
    if (logprobs !== tokens) throw new Error(`call ${c.call_id}: ${tokens} tokens but ${logprobs} logprobs`);
    this.calls.push({
      call_id: c.call_id,
      tokens,
      finish_reason: c.finish_reason,
      policy_version: Number(c.policy_version || 0),
      text: c.text || '',
    });
    return { text: c.text || '', callId: c.call_id };
  }

  /**
   * ReportReward: end the episode with each call's reward and the episode return (their sum).
   * @param {number[]} rewards - One reward per call, in call order.
   * @returns {Promise<{released: number, dropped: number}>} What the report released and dropped.
   */
  async report(rewards) {
    if (rewards.length !== this.calls.length) {
      throw new Error(`${rewards.length} rewards for ${this.calls.length} calls`);
    }
    const callRewards = Object.fromEntries(this.calls.map((c, i) => [c.call_id, rewards[i]]));
    const total = rewards.reduce((a, b) => a + b, 0);
    const resp = await m.unary(this.stub, 'ReportReward', {
      episode_id: this.opts.episodeId,
      rewards: { [this.opts.agent]: total },
      call_rewards: callRewards,
    }, this.md, this.opts.timeoutMs);
    return { released: Number(resp.released || 0), dropped: Number(resp.dropped || 0) };
  }

  /** Close the channel to the gateway. */
  close() {
    this.stub.close();
  }
}

module.exports = { GatewayPolicy, INSTRUCTION, loadInference };
