"""The folder ``lucid-assign run`` puts first on PYTHONPATH: its ``sitecustomize`` (nothing else here is imported)."""
