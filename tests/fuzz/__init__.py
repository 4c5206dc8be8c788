"""fuzz suite (issue 9)."""
