"""``mmd check``: grading outputs against their inputs or expected outputs (docs/grading.md)."""
