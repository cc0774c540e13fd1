"""One patched segmentation assigner call at a time, as a training step makes it: the peer's SegTaskAlignedAssigner
patched by lucid_assign.integrations.ultralytics, YOLO26's two settings (top-k 10, and top-k 7 with top-k2 1), under
bf16 autocast, on a synthetic batch (bench.scene("seg"): batch 16 at 640 px, 80 classes, masks at 160 x 160).

    python bench/seg_call.py                    # GPU: 20 and 100 objects per image
    python bench/seg_call.py --device cpu --batch 2 --objects 5 --calls 3   # smoke test

Each call starts on an idle device (synchronised before) and is timed to its end on the device (synchronised
after): "new shapes" gives every call new scores (the batch's scores times 1 + 5% noise), so that its chosen pairs,
and with them the shapes of the mask decode's products, are new, as they are from one training step to the next;
"host" is the host time until the call returns; "same inputs" repeats one batch (the product shapes seen before).
Last, the host time of the Python layers alone: the patched forward with the op replaced by a stub.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import timed  # noqa: E402
from lucid_assign import bench, ops  # noqa: E402
from lucid_assign.integrations import ultralytics as integ  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--objects", type=int, nargs="+", default=[20, 100])
    p.add_argument("--calls", type=int, default=40, help="calls per case (each with new scores)")
    args = p.parse_args(argv)
    device = args.device
    amp = torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    integ.patch()
    from ultralytics.utils import loss

    for objects in args.objects:
        batch = bench.scene("seg", args.batch, objects, device=device)[0]
        box = [batch[k] for k in bench.INPUTS]
        seg = {k: batch[k] for k in bench.SEG_INPUTS}
        g = torch.Generator(device=device).manual_seed(0)
        scores = [(box[0] * (1 + 0.05 * torch.randn(box[0].shape, device=device, generator=g))).clamp(0, 1)
                  for _ in range(args.calls)]
        for topk, topk2 in ((10, 10), (7, 1)):
            assigner = loss.SegTaskAlignedAssigner(topk=topk, topk2=topk2, num_classes=bench.num_classes_of("seg"),
                                                   alpha=0.5, beta=6.0, stride=[8, 16, 32])
            with amp:
                assigner(*box, **seg)  # the first call builds what later calls reuse
                host, new = zip(*(timed(lambda s=s: assigner(s, *box[1:], **seg), device) for s in scores))
                same = [timed(lambda: assigner(*box, **seg), device)[1] for _ in range(args.calls)]
            print(f"{objects:>4} objects, topk {topk:>2}/{topk2:<2}: new shapes {statistics.median(new) * 1e6:8.1f} us "
                  f"(host {statistics.median(host) * 1e6:7.1f} us), "
                  f"same inputs {statistics.median(same) * 1e6:8.1f} us", flush=True)

    assigner = loss.SegTaskAlignedAssigner(topk=10, num_classes=bench.num_classes_of("seg"), alpha=0.5, beta=6.0,
                                           stride=[8, 16, 32])
    with amp:
        out = assigner(*box, **seg)
        real = ops.assign_seg
        ops.assign_seg = lambda *a, **k: out
        try:
            python = [timed(lambda: assigner(*box, **seg), device)[0] for _ in range(300)]
        finally:
            ops.assign_seg = real
    print(f"the Python layers of a patched call (the op a stub): {statistics.median(python) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
