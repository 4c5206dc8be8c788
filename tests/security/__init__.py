"""security suite (issue 9)."""
