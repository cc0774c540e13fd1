"""Multi-GPU training with the peer trainer (ultralytics), with and without lucid-assign, through its own launch.

    python bench/train_ddp.py                       # 2 GPUs: yolo26n-obb at 1024 px, 256 images of 100-300 objects
    python bench/train_ddp.py --devices 0,1,2,3 --epochs 3 --cli
    python bench/train_ddp.py --task rtdetr         # 2 GPUs: the peer's rtdetr-l at 640 px, 80 classes

Writes a synthetic DOTA-like dataset (noise images, rotated objects; nothing downloaded), then trains
``YOLO("yolo26n-obb.yaml").train(device=[...])`` twice, each in a process of its own: unpatched, and after
``lucid_assign.integrations.ultralytics.patch()`` (``--task rtdetr``: ``RTDETR("rtdetr-l.yaml")``, whose loss calls the
patched matcher in every rank, on axis-aligned objects). The peer launches one process per GPU with
torch.distributed.run; with ``LUCID_ASSIGN_VERBOSE=1`` every patched process says that it patched itself and what each
assigner's first call ran, and on which device: that is the per-rank evidence. Epoch times come from the trainer's
results.csv (its cumulative time column): the first epoch includes the start, the last one the final validation, the
ones between are clean. ``--cli`` also trains through ``lucid-assign yolo obb train ...`` (one epoch) and shows its
evidence.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import read_results, run_logged  # noqa: E402


def train(args, variant: str) -> None:
    """One training run in this process (what the launching process of a multi-GPU run does)."""
    if variant == "patched":
        from lucid_assign.integrations import ultralytics as integ

        integ.patch(args.backend)
    from ultralytics import RTDETR, YOLO

    amp = {"false": False, "true": True}.get(args.amp.lower(), args.amp)
    model = (RTDETR if args.task == "rtdetr" else YOLO)(args.model)
    model.train(data=args.data, device=args.devices, epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                workers=args.workers, plots=False, val=False, amp=amp, seed=0, project=args.project, name=variant,
                exist_ok=True)


def evidence(log: str) -> dict:
    """Per process (rank or launcher), the lucid-assign lines it printed."""
    per = {}
    for line in log.splitlines():
        if line.startswith("lucid-assign ["):
            who = line[len("lucid-assign ["):].split("]")[0].split(", pid")[0]
            per.setdefault(who if who.startswith("rank") else "launcher", []).append(line.split("]: ", 1)[1])
    return per


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="0,1", help="GPU indices, as the peer's device= takes them")
    p.add_argument("--task", choices=("obb", "rtdetr"), default="obb")
    p.add_argument("--model", default=None, help="default: yolo26n-obb.yaml; rtdetr-l.yaml with --task rtdetr")
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--imgsz", type=int, default=None, help="default: 1024; 640 with --task rtdetr")
    p.add_argument("--objects", type=int, nargs=2, default=(100, 300), metavar=("LOW", "HIGH"))
    p.add_argument("--batch", type=int, default=16, help="total batch over the GPUs")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--backend", default="auto")
    p.add_argument("--amp", default="bf16", help="the peer's amp= (bf16; False on the CPU)")
    p.add_argument("--folder", default=None, help="where to write the dataset and the runs (default: a temp dir)")
    p.add_argument("--cli", action="store_true", help="also train one epoch through `lucid-assign yolo ...`")
    p.add_argument("--run", choices=("peer", "patched"), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--project", help=argparse.SUPPRESS)
    args = p.parse_args()
    rtdetr = args.task == "rtdetr"
    args.model = args.model or ("rtdetr-l.yaml" if rtdetr else "yolo26n-obb.yaml")
    args.imgsz = args.imgsz or (640 if rtdetr else 1024)
    if args.run:
        train(args, args.run)
        return 0

    from lucid_assign.synthetic import write_yolo_dataset

    folder = args.folder or tempfile.mkdtemp(prefix="lucid-ddp-")
    t = time.time()
    data = write_yolo_dataset(os.path.join(folder, "data"), images=args.images, img_size=args.imgsz,
                              num_classes=80 if rtdetr else 15, objects=tuple(args.objects), obb=not rtdetr, seed=0,
                              image_ext="jpg")
    print(f"dataset: {args.images} images at {args.imgsz} px, {args.objects[0]}-{args.objects[1]} objects each, "
          f"written in {time.time() - t:.1f} s to {data}", flush=True)
    project = os.path.join(folder, "runs")
    env = dict(os.environ, LUCID_ASSIGN_VERBOSE="1")
    base = [sys.executable, os.path.abspath(__file__), "--task", args.task, "--data", data, "--project", project,
            "--devices",
            args.devices, "--model", args.model, "--imgsz", str(args.imgsz), "--batch", str(args.batch), "--epochs",
            str(args.epochs), "--workers", str(args.workers), "--backend", args.backend, "--amp", args.amp]
    rows = []
    for variant in ("peer", "patched"):
        out, wall = run_logged(base + ["--run", variant], os.path.join(folder, f"{variant}.log"), env)
        if out.returncode != 0:
            return out.returncode
        times = read_results(os.path.join(project, variant, "results.csv"))[0]
        rows.append((variant, wall, times))
        print(f"\n[{variant}] wall {wall:.1f} s, epochs: {', '.join(f'{x:.2f} s' for x in times)}")
        for who, lines in sorted(evidence(out.stderr).items()):
            for line in dict.fromkeys(lines):
                print(f"  {who}: {line}")
    if args.cli and not rtdetr:
        cmd = [sys.executable, "-m", "lucid_assign", "yolo", "obb", "train", f"data={data}", f"model={args.model}",
               f"device={args.devices}", "epochs=1", f"imgsz={args.imgsz}", f"batch={args.batch}",
               f"workers={args.workers}", "plots=False", "val=False", f"amp={args.amp}", f"project={project}",
               "name=cli", "exist_ok=True"]
        t = time.time()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        with open(os.path.join(folder, "cli.log"), "w") as f:
            f.write(out.stdout + out.stderr)
        print(f"\n[cli] {' '.join(cmd[1:4])} ... exit {out.returncode}, {time.time() - t:.1f} s")
        for who, lines in sorted(evidence(out.stderr).items()):
            for line in dict.fromkeys(lines):
                print(f"  {who}: {line}")
    (_, peer_wall, peer), (_, ours_wall, ours) = rows
    mid = slice(1, -1) if len(peer) > 2 else slice(0, len(peer))
    a, b = sum(peer[mid]) / len(peer[mid]), sum(ours[mid]) / len(ours[mid])
    print(f"\nepoch time (epochs {mid.start + 1}-{mid.start + len(peer[mid])}): peer {a:.2f} s, patched {b:.2f} s "
          f"({100 * (a - b) / a:+.1f}%); whole run: {peer_wall:.1f} s vs {ours_wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
