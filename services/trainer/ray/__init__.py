"""Ray: the runtime (cluster, placement group, token auth) and the actors it starts (policy, rollout, reference
and critic workers)."""
