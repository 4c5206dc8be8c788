"""The SDK's plumbing: argument checks, the one ``module:attr`` loader, the one YAML reader, folder locks
and CPU features."""
