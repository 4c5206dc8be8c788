"""A job's ties to the services: addresses and token (:mod:`.addresses`), shared channels, env pool and clients
(:mod:`.connections`), riding out a service restart (:mod:`.reconnect`) and hosting the inference gateway during
a job (:mod:`.gateway_host`)."""
