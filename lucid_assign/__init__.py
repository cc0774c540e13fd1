"""lucid-assign: fused, memory-bounded task-aligned label assignment for YOLO-style detectors."""

from . import _library, ops, reference  # noqa: F401  (_library: loading the compiled ops on import)
from .api import assign, backends
from .assigner import RotatedTaskAlignedAssigner, TaskAlignedAssigner

__version__ = "0.1.0"
__all__ = ["assign", "backends", "ops", "reference", "TaskAlignedAssigner", "RotatedTaskAlignedAssigner"]
