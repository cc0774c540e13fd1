"""The ``lucid-assign`` console script: ``run`` launches (lucid_assign/_launch.py) before the package's modules load
(no torch, no import lock held while COMMAND runs); the other commands are lucid_assign.__main__'s."""


def console() -> int:
    from . import _launch

    if _launch.launching():
        return _launch.launch()
    from .__main__ import main

    return main()
