"""The sqlite engine."""
