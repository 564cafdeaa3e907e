"""Handlers the worker tests run; each records its run in ``Run``."""
