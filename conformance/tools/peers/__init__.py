"""Models of other engines' behaviour, for comparison only (never normative)."""
