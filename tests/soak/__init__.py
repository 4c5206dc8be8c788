"""soak suite (issue 9)."""
