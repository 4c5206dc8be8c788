"""The SDK's plumbing: argument checks, the one ``module:attr`` loader, the one YAML reader, folder locks,
fsync by path and CPU features."""
