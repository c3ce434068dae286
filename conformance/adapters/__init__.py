"""Adapters that let other engines run the conformance vectors (each in its own venv)."""
