"""The mysql engine."""
