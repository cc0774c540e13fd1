"""lucid-assign: fused, memory-bounded task-aligned label assignment for YOLO-style detectors, and exact batched
Hungarian matching for DETR-style ones."""

from . import _launch

if not _launch.launching():  # `lucid-assign run -- COMMAND`: the launcher loads no more of the package (no torch)
    from . import _library, ops, reference  # noqa: F401  (_library: loading the compiled ops on import)
    from ._version import __version__
    from .api import assign, assign_pose, assign_seg, pad_targets
    from .dispatch import FallbackWarning, backends
    from .matching import linear_sum_assignment
    from .assigner import (PoseTaskAlignedAssigner, RotatedTaskAlignedAssigner, SegTaskAlignedAssigner,
                           TaskAlignedAssigner)

__all__ = ["__version__", "FallbackWarning", "assign", "assign_pose", "assign_seg", "backends", "linear_sum_assignment",
           "pad_targets", "ops", "reference", "TaskAlignedAssigner", "RotatedTaskAlignedAssigner",
           "PoseTaskAlignedAssigner", "SegTaskAlignedAssigner"]
