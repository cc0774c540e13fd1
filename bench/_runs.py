"""What the bench scripts share: a logged run and the trainer's results.csv (those that train in child processes),
one call timed from an idle device (those that time single calls), and a DETR trainer's synthetic batch."""

from __future__ import annotations

import csv
import hashlib
import statistics
import subprocess
import time

import torch


def run_logged(cmd: list, log: str, env=None) -> tuple:
    """Runs ``cmd``, writes its stdout and stderr to ``log``: (the completed process, its wall time in seconds). A
    failed run prints the tail of its stderr."""
    t = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t
    with open(log, "w") as f:
        f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        print(out.stderr[-4000:])
    return out, wall


def read_results(results_csv: str) -> tuple:
    """(each epoch's time, the last row without its time column) from the peer trainer's results.csv, whose time
    column is cumulative."""
    with open(results_csv) as f:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]
    total = [float(row["time"]) for row in rows]
    epochs = [b - a for a, b in zip([0.0] + total[:-1], total)]
    return epochs, {k: v for k, v in rows[-1].items() if k != "time"}


def digest(obj) -> str:
    """A SHA-256 of a (nested) state: every tensor's dtype, shape and bytes, every number bit for bit, dict keys in
    sorted order. Two states with equal digests are equal byte for byte."""
    h = hashlib.sha256()

    def walk(o):
        if isinstance(o, torch.Tensor):
            t = o.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(o.shape)}:".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(o, dict):
            h.update(b"{")
            for k in sorted(o, key=repr):
                h.update(repr(k).encode() + b":")
                walk(o[k])
            h.update(b"}")
        elif isinstance(o, (list, tuple)):
            h.update(b"[")
            for v in o:
                walk(v)
            h.update(b"]")
        elif isinstance(o, float):
            h.update(o.hex().encode())
        elif o is None or isinstance(o, (bool, int, str, bytes)):
            h.update(repr(o).encode())
        else:  # a function or another object: its kind, not its address
            h.update(type(o).__qualname__.encode())
        h.update(b",")

    walk(obj)
    return h.hexdigest()


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    """Seconds of one call of fn from an idle device: until it returns, and to its end on the device."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    sync(device)
    return t1 - t0, time.perf_counter() - t0


def alternated(runs: list, steps: int, contexts: dict, one, device) -> None:
    """Times ``steps`` steps of each run, alternating which goes first (run A then B on even steps, B then A on odd):
    ``one(run, i)`` under ``contexts[run["patched"]]()``, each to its end on the device, appended to run["times"]."""
    for i in range(steps):
        for r in runs if i % 2 == 0 else runs[::-1]:
            with contexts[r["patched"]]():
                t0 = time.perf_counter()
                one(r, i)
                sync(device)
                r["times"].append(time.perf_counter() - t0)


def detr_batch(size: int, imgsz: int, objects: int, seed: int, device, classes: int, label_key: str):
    """Random images and a DETR trainer's targets for them, DOTA-like axis-aligned objects (lucid_assign.synthetic):
    per image its classes (under ``label_key``) and normalised cx cy w h boxes."""
    from lucid_assign.synthetic import dota_like_batch

    s = dota_like_batch(batch=size, img_size=imgsz, num_classes=classes, objects=objects, obb=False, seed=seed)
    targets = []
    for b in range(size):
        keep = s["mask_gt"][b, :, 0].bool()
        x1y1, x2y2 = s["gt_bboxes"][b][keep].split(2, -1)
        boxes = (torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), -1) / imgsz).clamp(0, 1)
        targets.append({label_key: s["gt_labels"][b][keep][:, 0].long().to(device), "boxes": boxes.to(device)})
    g = torch.Generator().manual_seed(seed)
    return torch.rand(size, 3, imgsz, imgsz, generator=g).to(device), targets


def paired_case(base: dict, ours: dict, indent: int, **fields) -> dict:
    """One case of a training-step benchmark, own (``base``) against patched (``ours``) runs of alternating steps:
    printed (the step's gain, and the median of the paired steps' gains) and returned as the record's entry."""
    paired = statistics.median(1 - q / u for u, q in zip(base["times"], ours["times"]))
    print(f"{'':>{indent}} step {100 * (1 - ours['step_s'] / base['step_s']):+.1f}% faster with the patch "
          f"(median of the paired steps: {100 * paired:+.1f}%)", flush=True)
    kept = ("step_s", "matcher_s", "calls", "call_s", "times")
    return dict(**fields, paired_faster=paired, **{name: {k: r[k] for k in kept if k in r}
                                                   for name, r in (("own", base), ("patched", ours))})
