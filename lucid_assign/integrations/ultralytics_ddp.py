"""Multi-GPU runs of the peer trainer: the peer trains on several GPUs by writing a script that torch.distributed.run
starts once per GPU, and those processes import the peer afresh. While patched, the script first patches its own
process with the patch's backend, so every rank builds lucid-assign's assigners."""

from __future__ import annotations

import os

_RANK_PREAMBLE = """\
# lucid-assign: this rank builds lucid-assign's assigners, as the process that launched it did
import sys as _lucid_sys
_lucid_sys.path[:0] = [_p for _p in {paths!r} if _p not in _lucid_sys.path]
from lucid_assign.integrations import ultralytics as _lucid_ultralytics
_lucid_ultralytics.patch({backend!r})
del _lucid_sys, _lucid_ultralytics
"""


def rank_patched(generate_ddp_file, backend):
    """The peer's generate_ddp_file, with the script it writes made to patch its rank first, with the backend
    ``backend()`` gives when the script is written."""

    def generate_ddp_file_patched(trainer):
        path = generate_ddp_file(trainer)
        with open(path, encoding="utf-8") as f:
            script = f.read()
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        script = _RANK_PREAMBLE.format(paths=[package_parent], backend=backend()) + script
        compile(script, path, "exec")  # the peer's script must still be a script (no __future__ import to keep first)
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        return path

    generate_ddp_file_patched.__wrapped__ = generate_ddp_file
    generate_ddp_file_patched.__doc__ = generate_ddp_file.__doc__
    return generate_ddp_file_patched
