'use strict';
/**
 * A minimal marti client for Node.js, written from the .proto files only.
 *
 * - Services are loaded at run time from protos/ with @grpc/proto-loader (no generated code).
 * - Broker frames (common.v1.CompressedFrame holding a serialized broker.v1.EnvelopeBatch) are built and read
 *   with protobufjs (proto-loader's own engine) and zstd (@bokuweb/zstd-wasm, WebAssembly: no native build).
 * - Env values (env.v1.Value) are converted to and from plain JavaScript values.
 *
 * Every limit is explicit: frames larger than `maxFrameBytes` are refused before decompression, and a
 * decompressed frame must have exactly the declared size (the same checks as marti/codec/broker.py).
 */

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');
const zstd = require('@bokuweb/zstd-wasm');

/** Proto files this client uses, relative to the proto root. */
const PROTO_FILES = [
  'marti/api/env/v1/env_service.proto',
  'marti/api/broker/v1/broker_service.proto',
  'marti/api/experience/v1/experience_service.proto',
];

/** Default largest decompressed frame accepted, bytes (32 MiB, as the Python SDK). */
const DEFAULT_MAX_FRAME_BYTES = 32 * 1024 * 1024;

/** proto-loader options: snake_case field names as in the .proto files, enums as names, oneof names set. */
const LOADER_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: false, oneofs: true };

let zstdReady = null;

/**
 * Initialise the zstd WebAssembly module once.
 * @returns {Promise<void>}
 */
function initZstd() {
  if (!zstdReady) zstdReady = zstd.init();
  return zstdReady;
}

/**
 * Load the marti services and the message types used inside frames.
 * @param {string} protoRoot - Folder holding marti/api/... (the repository's protos/).
 * @param {string[]} includeDirs - Extra import roots, e.g. a folder holding google/rpc/status.proto.
 * @returns {{env: Function, broker: Function, experience: Function, root: protobuf.Root}} Service client
 *   constructors and a protobufjs root for EnvelopeBatch.
 */
function loadApi(protoRoot, includeDirs = []) {
  const dirs = [protoRoot, ...includeDirs];
  const def = protoLoader.loadSync(PROTO_FILES, { ...LOADER_OPTIONS, includeDirs: dirs });
  const pkg = grpc.loadPackageDefinition(def);
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => {
    for (const d of dirs) {
      const p = path.join(d, target);
      try {
        require('node:fs').accessSync(p);
        return p;
      } catch (_) {
        /* try the next root */
      }
    }
    return target; // protobufjs knows google/protobuf/*.proto itself
  };
  root.loadSync('marti/api/broker/v1/broker.proto', { keepCase: true });
  return {
    env: pkg.marti.api.env.v1.EnvService,
    broker: pkg.marti.api.broker.v1.BrokerService,
    experience: pkg.marti.api.experience.v1.ExperienceService,
    root,
  };
}

/**
 * Channel credentials and per-call metadata for an optional bearer token (plaintext loopback channel).
 * @param {string|undefined} token - The services' token (`--token` / MARTI_TOKEN), or undefined.
 * @returns {grpc.Metadata} Metadata to pass on every call.
 */
function authMetadata(token) {
  const md = new grpc.Metadata();
  if (token) md.set('authorization', `Bearer ${token}`);
  return md;
}

/**
 * Promise wrapper of a unary call with a deadline.
 * @param {object} client - A grpc-js client.
 * @param {string} method - Method name, e.g. 'ListEnvs'.
 * @param {object} request - Request object (snake_case fields).
 * @param {grpc.Metadata} md - Metadata (auth).
 * @param {number} timeoutMs - Deadline in milliseconds.
 * @returns {Promise<object>} The response; rejects with the grpc error (err.code, err.details).
 */
function unary(client, method, request, md, timeoutMs = 30000) {
  return new Promise((resolve, reject) => {
    client[method](request, md, { deadline: Date.now() + timeoutMs }, (err, resp) =>
      err ? reject(err) : resolve(resp),
    );
  });
}

/**
 * Serialize envelopes into one CompressedFrame: zstd (level 3) unless that does not make it smaller.
 * @param {protobuf.Root} root - From loadApi.
 * @param {object[]} envelopes - broker.v1.Envelope objects (snake_case, payload as Buffer).
 * @returns {{codec: string, uncompressed_bytes: number, data: Buffer, dictionary_id: number}} The frame.
 */
function encodeFrame(root, envelopes) {
  const Batch = root.lookupType('marti.api.broker.v1.EnvelopeBatch');
  const raw = Buffer.from(Batch.encode(Batch.fromObject({ envelopes })).finish());
  const packed = Buffer.from(zstd.compress(raw, 3));
  if (packed.length >= raw.length) {
    return { codec: 'CODEC_NONE', uncompressed_bytes: raw.length, data: raw, dictionary_id: 0 };
  }
  return { codec: 'CODEC_ZSTD', uncompressed_bytes: raw.length, data: packed, dictionary_id: 0 };
}

/**
 * Decode a delivered CompressedFrame into envelopes, with the size checks of broker_codec.decode.
 * @param {protobuf.Root} root - From loadApi.
 * @param {object} frame - The frame (codec name, uncompressed_bytes, data).
 * @param {number} maxFrameBytes - Largest declared uncompressed size accepted, bytes.
 * @returns {object[]} Envelopes (payload as Buffer), in delivery order.
 * @throws {Error} Declared size over the limit, a dictionary frame (not supported here), unknown codec, or
 *   a decompressed size that differs from the declared one.
 */
function decodeFrame(root, frame, maxFrameBytes = DEFAULT_MAX_FRAME_BYTES) {
  if (!frame) return [];
  const declared = Number(frame.uncompressed_bytes || 0);
  const data = frame.data ? Buffer.from(frame.data) : Buffer.alloc(0);
  if (declared === 0 && data.length === 0) return [];
  if (declared > maxFrameBytes) {
    throw new Error(`frame declares ${declared} bytes, over the limit maxFrameBytes=${maxFrameBytes}`);
  }
  if (frame.dictionary_id) throw new Error(`frame uses zstd dictionary ${frame.dictionary_id}; not supported`);
  let raw;
  if (frame.codec === 'CODEC_ZSTD') raw = Buffer.from(zstd.decompress(data));
  else if (frame.codec === 'CODEC_NONE') raw = data;
  else throw new Error(`unknown frame codec ${frame.codec}`);
  if (raw.length !== declared) {
    throw new Error(`frame decompressed to ${raw.length} bytes but declares ${declared}`);
  }
  const Batch = root.lookupType('marti.api.broker.v1.EnvelopeBatch');
  const batch = Batch.toObject(Batch.decode(raw), { longs: Number, defaults: true });
  return batch.envelopes.map((e) => ({ ...e, payload: Buffer.from(e.payload) }));
}

/**
 * Convert a JavaScript value to env.v1.Value (integers become int_value, other numbers float_value).
 * @param {*} v - null, boolean, number, string, array or plain object.
 * @returns {object} The Value message object.
 */
function toValue(v) {
  if (v === null || v === undefined) return { null_value: 'NULL_VALUE' };
  if (typeof v === 'boolean') return { bool_value: v };
  if (typeof v === 'number') return Number.isInteger(v) ? { int_value: v } : { float_value: v };
  if (typeof v === 'string') return { text: v };
  if (Array.isArray(v)) return { list: { values: v.map(toValue) } };
  if (typeof v === 'object') {
    const fields = {};
    for (const [k, x] of Object.entries(v)) fields[k] = toValue(x);
    return { map: { fields } };
  }
  throw new Error(`cannot convert ${typeof v} to an env Value`);
}

/**
 * Convert env.v1.Value to a JavaScript value (tensors are returned as {dtype, shape, data}).
 * @param {object|undefined} v - The Value message object.
 * @returns {*} The plain value.
 */
function fromValue(v) {
  if (!v || !v.kind || v.kind === 'null_value') return null;
  const x = v[v.kind];
  if (v.kind === 'list') return (x.values || []).map(fromValue);
  if (v.kind === 'map') {
    const out = {};
    for (const [k, y] of Object.entries(x.fields || {})) out[k] = fromValue(y);
    return out;
  }
  return x;
}

/**
 * Turn a Reset/Step response into PettingZoo-style dictionaries keyed by agent.
 * @param {object} resp - ResetResponse or StepResponse.
 * @returns {{observations: object, rewards: object, terminations: object, truncations: object,
 *   infos: object, agents: string[], acting: string[]}} The parsed result.
 */
function parseStep(resp) {
  const out = { observations: {}, rewards: {}, terminations: {}, truncations: {}, infos: {} };
  const infos = resp.infos_json ? JSON.parse(resp.infos_json) : null;
  for (const r of resp.results || []) {
    out.observations[r.agent] = fromValue(r.observation);
    out.rewards[r.agent] = Number(r.reward || 0);
    out.terminations[r.agent] = Boolean(r.terminated);
    out.truncations[r.agent] = Boolean(r.truncated);
    out.infos[r.agent] = infos ? infos[r.agent] || {} : fromValue({ kind: 'map', map: r.info || {} });
  }
  out.agents = resp.agents || [];
  out.acting = resp.acting_agents || [];
  return out;
}

module.exports = {
  DEFAULT_MAX_FRAME_BYTES,
  LOADER_OPTIONS,
  authMetadata,
  decodeFrame,
  encodeFrame,
  fromValue,
  initZstd,
  loadApi,
  parseStep,
  toValue,
  unary,
  grpc,
};
