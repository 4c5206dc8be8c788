"""faults suite (issue 9)."""
