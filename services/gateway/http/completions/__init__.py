"""OpenAI's Chat Completions and Completions routes (``POST /v1/chat/completions``, ``POST /v1/completions``): their
request models, tool calls, streamed chunks and handlers."""
