"""The server side: hosting services (health, reflection, graceful stop), binding ports exclusively, and
the interceptors (request id, access log, metrics, auth, error mapping)."""
