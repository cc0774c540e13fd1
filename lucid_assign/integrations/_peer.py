"""The installed peer trainer (ultralytics), as lucid-assign's integration finds it: its version, the module of its
assigners, the modules whose losses build them and the module that writes its multi-GPU scripts, from 8.0 to 8.4
(whose layouts differ). Nothing is imported from ultralytics until asked."""

from __future__ import annotations

import importlib
import inspect
import types

VERIFIED_VERSION = "8.4.190"  # the release the package's own tests run against
TESTED_RANGE = ">=8.0.200,<8.5"  # the releases the survey ran (docs/releases.md); the extra's requirement
NAMES = ("TaskAlignedAssigner", "RotatedTaskAlignedAssigner", "PoseTaskAlignedAssigner", "SegTaskAlignedAssigner")
# Where the peer keeps its modules: ultralytics.utils since 8.0.1xx, ultralytics.yolo before, where the earliest
# releases built their losses in each task's trainer module.
_TAL_MODULES = ("ultralytics.utils.tal", "ultralytics.yolo.utils.tal")
_LOSS_MODULES = ("ultralytics.utils.loss", "ultralytics.yolo.utils.loss", "ultralytics.yolo.v8.detect.train",
                 "ultralytics.yolo.v8.segment.train", "ultralytics.yolo.v8.pose.train")
_DIST_MODULES = ("ultralytics.utils.dist", "ultralytics.yolo.utils.dist")


def first_module(names):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


class Peer(types.SimpleNamespace):
    """The installed peer: version, its assigner module (tal), the modules whose losses build assigners (losses)
    and the module that writes multi-GPU scripts (dist, or None)."""


def find_peer() -> Peer:
    try:
        import ultralytics
    except ImportError as exc:
        raise ImportError(
            "lucid_assign.integrations.ultralytics needs the ultralytics package "
            f"(pip install 'lucid-assign[ultralytics]', or ultralytics{TESTED_RANGE})"
        ) from exc
    version = getattr(ultralytics, "__version__", "unknown")
    tal = first_module(_TAL_MODULES)
    if tal is None:
        raise RuntimeError(f"ultralytics {version} has no assigner module ({' or '.join(_TAL_MODULES)}): nothing "
                           "to patch")
    losses = []
    for name in _LOSS_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if any(isinstance(getattr(module, n, None), type) for n in NAMES):
            losses.append(module)
    return Peer(version=version, tal=tal, losses=losses, dist=first_module(_DIST_MODULES))


def accepted(cls, settings: dict) -> dict:
    """Of ``settings``, those the constructor of the peer's ``cls`` takes (8.0 to 8.3: no stride or topk2)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()) and cls.__init__ is not object.__init__:
        base = next((c for c in cls.__mro__[1:] if "topk" in inspect.signature(c.__init__).parameters), None)
        params = {**params, **(inspect.signature(base.__init__).parameters if base else {})}
    return {k: v for k, v in settings.items() if k in params}
