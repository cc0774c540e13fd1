"""Loads the compiled library (lucid_assign._C), which registers the torch.ops.lucid.* operators.

The package works without it (the reference assigner is pure PyTorch), but a library that is missing, was built for
another torch, or fails to load is said at import, once, with the reason and the fix (``LOAD_ERROR`` and
``LOAD_FIX`` keep them; ``lucid-assign doctor`` prints them). Set LUCID_ASSIGN_DISABLE_EXT=1 to skip loading it, for
example to check that path; nothing is said then.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

DISABLED = os.environ.get("LUCID_ASSIGN_DISABLE_EXT", "0") == "1"
LOAD_ERROR: str | None = None
LOAD_FIX: str | None = None
BUILD: dict | None = None  # how the library was built (setup.py writes lucid_assign/_build_info.py)

REBUILD = ("rebuild it against the torch you run: pip install --force-reinstall --no-deps --no-cache-dir lucid-assign "
           "(from a clone: pip install --no-build-isolation -e .), or install the lucid-assign wheel built for "
           "torch {torch}")


class LibraryWarning(UserWarning):
    """The compiled library could not be loaded: the kernels are unavailable."""


def _minor(version: str) -> tuple:
    return tuple(version.split("+")[0].split(".")[:2])


def _load() -> tuple[str | None, str | None]:
    """Load the library; return (why it is not loaded, how to fix it), or (None, None)."""
    global BUILD
    if DISABLED:
        return "disabled by LUCID_ASSIGN_DISABLE_EXT=1", "unset LUCID_ASSIGN_DISABLE_EXT"
    running = _minor(torch.__version__)
    fix = REBUILD.format(torch=".".join(running))
    try:
        from ._build_info import BUILD as info
    except ImportError:
        return "lucid_assign._C is not built (no build record next to the package)", fix
    BUILD = dict(info)
    built = BUILD.get("torch", "unknown")
    if _minor(built) != running:  # another torch's C++ ABI: loading could crash rather than fail
        return f"lucid_assign._C was built for torch {built}, but torch {torch.__version__} is running", fix
    try:
        from . import _C  # noqa: F401  (importing runs the TORCH_LIBRARY registrations)
    except Exception as exc:  # not built, a missing symbol or CUDA library, a namespace registered twice, ...
        return f"lucid_assign._C (built for torch {built}) failed to load: {type(exc).__name__}: {exc}", fix
    return None, None


LOAD_ERROR, LOAD_FIX = _load()
if LOAD_ERROR is not None and not DISABLED:
    warnings.warn(f"lucid_assign: the compiled kernels are not available ({LOAD_ERROR}); only the slower "
                  f"pure-PyTorch reference can run. Fix: {LOAD_FIX}", LibraryWarning, stacklevel=2)


def loaded() -> bool:
    """True when the compiled library is loaded and its ops are registered."""
    return LOAD_ERROR is None


def limit(name: str) -> int:
    """A limit of the kernels as the loaded library declares it (csrc/geometry.h): ``"MAX_KEYPOINTS"`` (keypoints per
    object) or ``"MAX_MASK_PIXELS"`` (mh * mw of the masks)."""
    from . import _C

    return getattr(_C, name)


def has_kernel(op: str, device_type: str) -> bool:
    """True when ``lucid::<op>`` has an implementation for ``device_type`` ("cpu" or "cuda")."""
    return loaded() and _registered(op, {"cpu": "CPU", "cuda": "CUDA"}[device_type])


@functools.lru_cache(maxsize=None)
def _registered(op: str, key: str) -> bool:
    """The dispatcher's answer, asked once: the library registers its kernels when it loads, and never again."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"lucid::{op}", key)
