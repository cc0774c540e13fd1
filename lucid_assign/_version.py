"""The package version (setup.py reads it; a wheel adds +pt<torch>cu<cuda> or +pt<torch>cpu)."""

__version__ = "0.2.0"
