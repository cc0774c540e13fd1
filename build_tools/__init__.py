"""What lucid-assign's build (setup.py) uses besides setuptools and torch; not installed with the package."""
