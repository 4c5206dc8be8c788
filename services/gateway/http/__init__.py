"""OpenAI-compatible HTTP adapter of the inference gateway (FastAPI).

Routes (every one needs ``Authorization: Bearer <token>`` when the app has a token; ``/v1/messages`` also takes
it as ``x-api-key``, the header Anthropic's clients send):

* ``GET  /v1/models``: every servable model name (each agent, and ``agent@VERSION`` per resident version).
* ``GET  /v1/models/{model}``: one of them (404 with the OpenAI error JSON for any other name).
* ``POST /v1/chat/completions``: chat completions, optionally streamed as server-sent events.
* ``POST /v1/completions``: text completions of a string or of token ids, optionally streamed.
* ``POST /v1/responses``: OpenAI's Responses API (string or item input, ``function_call`` output items and
  ``function_call_output`` input items, ``previous_response_id`` within an episode), served through the same chat
  call as chat completions, optionally streamed as the Responses events (:mod:`.responses.protocol`,
  :mod:`.responses.store`, :mod:`.responses.serving`).
* ``POST /v1/messages``: Anthropic's Messages API (text, ``tool_use`` and ``tool_result`` blocks), served through
  the same chat call as chat completions, optionally streamed as Anthropic's events; its errors have Anthropic's
  shape (:mod:`.anthropic.protocol`, :mod:`.anthropic.serving`).
* ``POST /v1/episodes/{episode_id}/reward``: report an episode's rewards (releases it to training); 202 with
  ``"queued": N`` when its released episodes were not inserted within ``gateway.report_wait_s``, 429 while
  ``gateway.max_backlog_episodes`` wait.
* ``GET  /v1/gateway/stats``: the gateway's counters.

**Episode context.** A call is recorded for training when it names an episode: with the header
``X-Marti-Episode`` (and optionally ``X-Marti-Group``), or through the same inference routes under
``/episodes/{episode_id}/v1/...`` and ``/episodes/{episode_id}/groups/{group_id}/v1/...``, so unchanged client
code can carry the ids in its ``base_url``. A header and a path that name different episodes are refused, and so is
``X-Marti-Group`` without an episode (a group is a set of episodes; the call would train nothing). Header
values (``X-Marti-Episode``, ``X-Marti-Group``, ``Idempotency-Key``) must be printable ASCII, and path ids valid
UTF-8 once percent-decoded; anything else is refused with 400 naming the header or the path parameter, so no id
is ever garbled (Latin-1) or merged with another (U+FFFD).

**Retries are recorded once.** A traced call whose client disconnected (or timed out) before the answer was ready
is not recorded, so the client's retry is the one that trains. A disconnect cancels the call as a gRPC cancel
does: still queued, it is dropped before it reaches the engine (unless it has an idempotency key: a retry may
wait for it); already running, it runs to the end and its answer is discarded. A call may also carry an ``Idempotency-Key`` header
(``extra_headers`` in the openai client): a retry with the same key within the same open episode gets the first
call's answer (same ``call_ids``) without generating or recording again (see :meth:`Gateway.generate`).

**Extensions** (like vLLM's ``return_token_ids`` and Agent Lightning): every response has ``prompt_token_ids``
(the prompt as the model saw it, chat template applied), ``policy_version`` (the oldest version among the
choices; they differ only when a weight update lands between two batches of one request), ``call_ids`` (one per
choice, the ids per-call rewards name) and ``agent``; every choice has ``token_ids`` (exactly the generated ids,
eos included when generation stopped on it), ``call_id`` and ``policy_version``. When streaming, the first
chunk carries ``prompt_token_ids`` and each choice's final chunk (the one with ``finish_reason``) carries
``token_ids``, ``call_id`` and ``policy_version``.

**Log-probabilities** are the raw (temperature 1) log-probabilities of the sampled tokens under the policy that
sampled them (see :mod:`marti.types.inference`); alternatives are not recorded, so ``top_logprobs`` must be 0 or absent
(chat: each token's ``top_logprobs`` is ``[]``) and ``logprobs`` 0 or 1 (completions: each position's
``top_logprobs`` entry is ``{token: logprob}`` of the sampled token alone, as vLLM always includes the sampled
token). A token's ``token`` (completions: its entry of ``tokens``) is its
own decoded text, special tokens included; a token that holds only part of a multi-byte character (byte-level
tokenizers split emoji and CJK characters) decodes to U+FFFD there. Its ``bytes`` are the token's exact bytes
when the backend keeps the agent's Hugging Face tokenizer in a ``tokenizers`` mapping (both backends of
:mod:`services.trainer.rollout.serving.gateway_backend` do) and that tokenizer is byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM);
otherwise the UTF-8 of its text, or, for a token that is part of a character, of the text it completes (see the
stream's pieces below), so that the bytes of a completion's tokens still join to its text. ``text_offset`` is where
each token's piece starts in ``text``.

**Streaming.** The engine generates whole responses, so a stream starts when the generation is done and then
sends the role, the content deltas, the final chunk with ``finish_reason``, the usage chunk when
``stream_options.include_usage`` is set, and ``data: [DONE]``. Each generated token's delta is the text it adds
under incremental detokenization (:func:`services.gateway.convert.token_texts`, as the gRPC stream): a character
split over tokens arrives whole with its last token, and the deltas join to the completion's text exactly. Tokens
that add no text send no delta, unless log-probabilities were asked for (then every token has its chunk). Errors
still arrive as plain HTTP errors before any event is sent.

**Limits.** A request body larger than ``gateway.max_request_bytes`` is refused with 413 (by its
``Content-Length``, or once that many bytes arrived). Episode and group ids longer than ``gateway.max_id_chars``
characters, or containing ``/`` (the gateway's rule; also percent-encoded in a path, ``%2F``), are refused with
400, on the inference routes and the reward route alike. Strings of the request (messages, prompt, stop strings, ids, the model) must be encodable as UTF-8: a
lone surrogate escape such as ``"\\ud800"`` is refused with 400 naming the field.

Hints that change nothing generated (``user``, ``metadata``, ``service_tier``, ...) are accepted and ignored, as
OpenAI clients send them (``tools`` are rendered and the calls parsed: docs/gateway.md, "Tools"); sampling settings
the engine does not apply (``presence_penalty``, ``frequency_penalty``, ``logit_bias``, vLLM's ``min_p`` and
``repetition_penalty``) are refused with 400 naming them unless neutral
(:func:`~services.gateway.http.common.protocol.unapplied`); ``echo`` is refused, and so is a
``response_format`` other than ``{"type": "text"}`` (structured output: the engine cannot constrain its sampling to
a JSON schema, and an answer that silently ignored it would look like a model error); so are chat's deprecated
``functions`` and ``function_call`` (use ``tools`` and ``tool_choice``) and completions' ``suffix`` and ``best_of``
above 1 (use ``n``), each naming what to use. A tool or named ``tool_choice`` in another API's shape is refused
showing the route's (:mod:`services.gateway.http.common.tool_shapes`). The reward report's body
refuses unknown keys (a typo such as ``reward`` or ``groupsize`` would otherwise train with reward 0 or as a group
of one), naming them.

**Where things are.** The reward route is also served under the episode prefixes
(``/episodes/{episode_id}[/groups/{group_id}]/v1/episodes/{episode_id}/reward``, what a client whose ``base_url``
carries the ids naturally posts to): the two episode ids must be the same, and the prefix's group is the report's
``group_id`` unless the body gives the same one. The ``X-Marti-Episode`` and ``X-Marti-Group`` headers are read
there too (a different episode or group: 400 naming the header; the header's group when the body has none). An
unknown route gets a 404 whose message lists the routes that
exist.

**Lifecycle.** :func:`~services.gateway.http.app.build_app` does not own the gateway: the caller runs
``await gateway.start()`` on the loop that serves the app before serving and ``await gateway.close()`` after (the
gRPC adapter may share the loop and the gateway).

**Folders** (by role, one purpose a module, after vLLM's ``entrypoints/openai``), each folder importing only the
ones below it (``lint-imports`` keeps it so):

* :mod:`.app`: the FastAPI app. :mod:`.app.build` (:func:`~services.gateway.http.app.build_app` and the error
  handlers), :mod:`.app.routes` (the routes, ``/v1/models`` among them), :mod:`.app.middleware` (authentication,
  the body limit and the catch-all error answer), :mod:`.app.json_body` (the JSON body parsing every route
  shares: a non-finite number is refused naming where) and :mod:`.app.reward` (the reward route: its body and
  handlers).
* One folder per API: :mod:`.completions` (OpenAI's Chat Completions and Completions: :mod:`.completions.protocol`
  the request bodies and ``usage``, :mod:`.completions.chat_tools` the chat route's side of tool calling,
  :mod:`.completions.sse` the streamed chunks, :mod:`.completions.serving` the handlers); :mod:`.responses`
  (:mod:`.responses.protocol`, :mod:`.responses.store` and :mod:`.responses.serving`: the Responses API's request
  and its translation, the stored responses ``previous_response_id`` continues, and its answer and events);
  :mod:`.anthropic` (:mod:`.anthropic.protocol` and :mod:`.anthropic.serving`: the Messages API's request, its
  translation into a chat call, and its answer and events).
* :mod:`.common`: what the APIs share. :mod:`.common.chat_service` (the protocol-neutral chat call every chat API
  is served through), :mod:`.common.generate` (one generation: resolve, render, size ``max_tokens``, generate),
  :mod:`.common.context` (the episode and group ids of a call, from the path or the headers),
  :mod:`.common.tokens` (detokenization: each token's text, piece and bytes, and the log-probability objects),
  :mod:`.common.protocol` (the request fields every API shares and the response extensions), :mod:`.common.sse`
  (named server-sent events), :mod:`.common.tool_shapes` (each API's tool shape) and :mod:`.common.errors`
  (exceptions to OpenAI error bodies, or Anthropic's on ``/v1/messages``).
"""
