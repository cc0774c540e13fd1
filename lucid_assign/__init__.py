"""lucid-assign: fused, memory-bounded task-aligned label assignment for YOLO-style detectors."""

from . import _library, ops, reference  # noqa: F401  (_library: loading the compiled ops on import)
from ._version import __version__
from .api import assign, backends
from .assigner import RotatedTaskAlignedAssigner, TaskAlignedAssigner

__all__ = ["__version__", "assign", "backends", "ops", "reference", "TaskAlignedAssigner",
           "RotatedTaskAlignedAssigner"]
