"""Trainers for the CPU that go through the peer's multi-GPU launch: in the process that trains, each writes the
peer's DDP script and starts it with torch.distributed.run (the peer's own generate_ddp_command and launch code) for
two ranks, which then train on the CPU over a gloo process group, each on its half of the data. Everything of a
multi-GPU run but the GPUs (and the gradient all-reduce, which a CPU model does not get). The peer pickles the
trainer class, so the ranks import this module by name.

With LUCID_TEST_CHECK_MATCHER=1 a rank also runs the peer's own RT-DETR matcher on the inputs of every call of the
patched one and says at its exit how many calls there were and how many matched the same:

    lucid-assign-check rank R: N matcher calls, N the same as the peer's own"""

import atexit
import os
import sys

import torch
import torch.distributed as dist
from ultralytics.models.rtdetr.train import RTDETRTrainer
from ultralytics.models.yolo.obb import OBBTrainer

RANKS = 2


class _Launched:
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "LOCAL_RANK" not in os.environ:  # the launching process launches the ranks; a rank trains
            self.world_size = RANKS
            self.ddp = True

    def _setup_train(self):
        if "LOCAL_RANK" in os.environ and not dist.is_initialized():  # the samplers of a rank need a process group
            dist.init_process_group("gloo")
        return super()._setup_train()

    def final_eval(self):
        if "LOCAL_RANK" not in os.environ:
            return super().final_eval()
        # a rank's validation of the saved weights picks a CUDA device; the epoch's validation above ran on the CPU


class LaunchedOBBTrainer(_Launched, OBBTrainer):
    pass


class LaunchedRTDETRTrainer(_Launched, RTDETRTrainer):
    pass


def _check_matcher_calls():
    """In this rank, every call of the patched RT-DETR matcher also run by the peer's own matcher it keeps."""
    from lucid_assign.integrations.ultralytics_detr import LucidHungarianMatcher

    patched, calls = LucidHungarianMatcher.forward, []

    def forward(self, *args, **kwargs):
        ours = patched(self, *args, **kwargs)
        theirs = self._peer_matcher(*args, **kwargs)
        calls.append(len(ours) == len(theirs) and all(
            torch.equal(a.cpu(), c.cpu()) and torch.equal(b.cpu(), d.cpu()) for (a, b), (c, d) in zip(ours, theirs)))
        return ours

    LucidHungarianMatcher.forward = forward
    atexit.register(lambda: print(f"lucid-assign-check rank {os.environ['RANK']}: {len(calls)} matcher calls, "
                                  f"{sum(calls)} the same as the peer's own", file=sys.stderr, flush=True))


if "LOCAL_RANK" in os.environ and os.environ.get("LUCID_TEST_CHECK_MATCHER") == "1":
    _check_matcher_calls()
