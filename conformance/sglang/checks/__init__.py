"""Findings about SGLang, reproduced through its own request path (run in its venv)."""
