"""The postgresql engine."""
