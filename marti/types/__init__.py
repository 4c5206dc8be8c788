"""Types shared by the SDK, the services and agents' code: trajectories, the experience store's tables,
generations, chat message content and tool calls."""
