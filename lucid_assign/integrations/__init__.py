"""Integrations with trainers. Each submodule imports its trainer only when called."""
