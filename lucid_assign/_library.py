"""Loads the compiled library (lucid_assign._C), which registers the torch.ops.lucid.* operators.

The package works without it: the reference assigner is pure PyTorch. Set LUCID_ASSIGN_DISABLE_EXT=1 to skip loading
it (for example to check that path).
"""

from __future__ import annotations

import os

import torch

LOAD_ERROR: str | None = None

if os.environ.get("LUCID_ASSIGN_DISABLE_EXT", "0") == "1":
    LOAD_ERROR = "disabled by LUCID_ASSIGN_DISABLE_EXT=1"
else:
    try:
        from . import _C  # noqa: F401  (importing runs the TORCH_LIBRARY registrations)
    except ImportError as exc:  # not built, or built against another torch
        LOAD_ERROR = f"{type(exc).__name__}: {exc}"


def loaded() -> bool:
    """True when the compiled library is loaded and its ops are registered."""
    return LOAD_ERROR is None


def has_kernel(op: str, device_type: str) -> bool:
    """True when ``lucid::<op>`` has an implementation for ``device_type`` ("cpu" or "cuda")."""
    if not loaded():
        return False
    key = {"cpu": "CPU", "cuda": "CUDA"}[device_type]
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"lucid::{op}", key)
