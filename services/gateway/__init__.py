"""The inference gateway: every agent's current policy over OpenAI-compatible HTTP and gRPC, with trace capture.

``core/`` is the pure domain (request batching, episode traces, the gateway facade); the ``http`` package and
``servicer.py`` are the thin HTTP and gRPC adapters; ``server.py`` runs both.
"""
