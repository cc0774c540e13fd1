"""A trainer for the CPU that goes through the peer's multi-GPU launch: in the process that trains, it writes the
peer's DDP script and starts it with torch.distributed.run (the peer's own generate_ddp_command and launch code) for
two ranks, which then train on the CPU over a gloo process group, each on its half of the data. Everything of a
multi-GPU run but the GPUs (and the gradient all-reduce, which a CPU model does not get). The peer pickles the
trainer class, so the ranks import this module by name."""

import os

import torch.distributed as dist
from ultralytics.models.yolo.obb import OBBTrainer

RANKS = 2


class LaunchedOBBTrainer(OBBTrainer):
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
