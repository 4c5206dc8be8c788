"""Shared gRPC plumbing, in rooms by side: :mod:`marti.rpc.client` (channels, the one call layer, the closed-state
guard, message limits, the stream watchdog, health checks) and :mod:`marti.rpc.serving` (hosting services,
binding ports, interceptors); beside them what both sides share: the error mapping (:mod:`marti.rpc.errors`),
channel and server options, settings, addresses, message paging and test helpers (:mod:`marti.rpc.testing`)."""
