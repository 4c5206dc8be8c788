"""The Anthropic Messages API route (``POST /v1/messages``): its request model and translation, and its handler."""
