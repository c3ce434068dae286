"""Certification: run every vector against an engine and report (`kvcert certify`)."""
