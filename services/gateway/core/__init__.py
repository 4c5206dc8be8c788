"""Pure domain of the inference gateway: no HTTP, no gRPC."""
