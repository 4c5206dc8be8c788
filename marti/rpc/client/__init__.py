"""The client side of every marti channel: channels and their options per event loop, the one call layer
with errors mapped once, the closed-state guard, message-size limits, the stream watchdog and health
checks."""
