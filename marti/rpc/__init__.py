"""Shared gRPC plumbing: server bootstrap, channels, error mapping, interceptors and test helpers."""
