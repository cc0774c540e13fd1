"""Complete fits with the peer trainer (ultralytics), plain and patched, alternating: the training time a user sees.

    python bench/fit_time.py --recipe dota-obb                  # yolo26n-obb at 1024 px, 3 pairs of fits
    python bench/fit_time.py --recipe coco-hbb --cache ram --workers 16
    python bench/fit_time.py --recipe dota-obb --device cpu --amp false --images 8 --imgsz 128 --epochs 2 --pairs 1

Writes a synthetic dataset once (noise images, DOTA-like objects; nothing downloaded), then runs
``YOLO("<model>.yaml").train(...)`` (``RTDETR(...)`` for RT-DETR) to the end, each fit in a process of its own:
unpatched and after ``lucid_assign.integrations.ultralytics.patch()``, alternating (pair k starts with the plain fit
when k is even, with the patched one when k is odd), at least --pairs pairs. Validation runs once, after the last
epoch, as the trainer does with ``val=False``.

Per variant it reports the median and the range of the epoch times (the epochs after the first, which holds the
start; the last holds the final validation and is left out when there are more than two), of the whole fit (the
process's wall time), and the share of the epochs the training loop waited for the data loader (from the trainer's
callbacks: the time from an epoch's start or a batch's end to the next batch's start). A recipe whose loop waits for
its loader for most of an epoch is bound by the loader (raise --workers, or --cache ram); one that hardly waits is
bound by the GPU. Last, whether every fit ended with the same losses and metrics (results.csv's last row, all but its
time column). --out writes the record (environment, arguments, every fit) as JSON.

Recipes (--images, --imgsz, --model and --classes override them):
  dota-obb   yolo26n-obb, 1024 px, 15 classes, 256 images; objects per image log-normal with a median of 60, one
             image of 1,200 (the tail past 1,000)
  dense-obb  yolo26n-obb, 1024 px, 15 classes, 128 images of 1,000-2,000 objects
  coco-hbb   yolo26n, 640 px, 80 classes, 512 images; log-normal with a median of 4, one image of 60
  rtdetr     the peer's rtdetr-l, 640 px, 80 classes, 256 images, objects as coco-hbb
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import read_results, run_logged  # noqa: E402


class Recipe(NamedTuple):
    model: str
    imgsz: int
    classes: int
    obb: bool
    images: int
    counts: tuple  # ("lognormal", median, sigma, tail) or ("uniform", low, high)


RECIPES = {
    "dota-obb": Recipe("yolo26n-obb.yaml", 1024, 15, True, 256, ("lognormal", 60, 1.2, 1200)),
    "dense-obb": Recipe("yolo26n-obb.yaml", 1024, 15, True, 128, ("uniform", 1000, 2000)),
    "coco-hbb": Recipe("yolo26n.yaml", 640, 80, False, 512, ("lognormal", 4, 1.0, 60)),
    "rtdetr": Recipe("rtdetr-l.yaml", 640, 80, False, 256, ("lognormal", 4, 1.0, 60)),
}


def object_counts(rule: tuple, images: int, seed: int = 0) -> list:
    """Objects per image: log-normal around a median (at least 1, at most 1,500) with image 0 holding the tail, or
    uniform in a range."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if rule[0] == "uniform":
        low, high = rule[1:]
        return [int(n) for n in torch.randint(low, high + 1, (images,), generator=g)]
    median, sigma, tail = rule[1:]
    draws = torch.randn(images, generator=g, dtype=torch.float64) * sigma + math.log(median)
    counts = [min(max(1, round(math.exp(x))), 1500) for x in draws.tolist()]
    if counts:
        counts[0] = tail
    return counts


# ---- one fit (the child process) --------------------------------------------------------------------------------

def fit(args) -> None:
    """One complete fit in this process; the loader waits of each epoch go to <project>/<name>/waits.json."""
    if args.run == "patched":
        from lucid_assign.integrations import ultralytics as integ

        integ.patch(args.backend)
    import ultralytics

    # the peer builds its RT-DETR models with their own class (YOLO(...) does not take their YAML)
    model = (ultralytics.RTDETR if "rtdetr" in os.path.basename(args.model) else ultralytics.YOLO)(args.model)
    waits, marks = [], {}

    def epoch_start(trainer):
        waits.append(0.0)
        marks["free"] = time.perf_counter()

    def batch_start(trainer):
        waits[-1] += time.perf_counter() - marks["free"]

    def batch_end(trainer):
        marks["free"] = time.perf_counter()

    model.add_callback("on_train_epoch_start", epoch_start)
    model.add_callback("on_train_batch_start", batch_start)
    model.add_callback("on_train_batch_end", batch_end)
    amp = {"false": False, "true": True}.get(args.amp.lower(), args.amp)
    cache = {"false": False, "true": True}.get(args.cache.lower(), args.cache)
    model.train(data=args.data, device=args.device, epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                workers=args.workers, cache=cache, amp=amp, plots=False, val=False, seed=0, deterministic=True,
                project=args.project, name=args.name, exist_ok=True)
    with open(os.path.join(args.project, args.name, "waits.json"), "w") as f:
        json.dump(waits, f)


# ---- the benchmark (the parent process) -------------------------------------------------------------------------

def clean(epochs: list) -> list:
    """The epochs after the first (the start), and before the last (the final validation) when there are more
    than two."""
    return epochs[1:-1] if len(epochs) > 2 else epochs[1:] or epochs


def spread(values: list) -> dict:
    return dict(median=statistics.median(values), min=min(values), max=max(values)) if values else {}


def summary(fits: list) -> dict:
    out = {}
    for variant in ("plain", "patched"):
        mine = [f for f in fits if f["variant"] == variant]
        epochs = [e for f in mine for e in clean(f["epochs"])]
        shares = [w / e for f in mine for w, e in zip(clean(f["waits"]), clean(f["epochs"])) if e > 0]
        out[variant] = dict(epoch_s=spread(epochs), fit_s=spread([f["wall_s"] for f in mine]),
                            loader_wait_share=spread(shares))
    finals = [json.dumps(f["final"], sort_keys=True) for f in fits]
    out["identical"] = len(set(finals)) == 1
    a, b = out["plain"]["epoch_s"].get("median"), out["patched"]["epoch_s"].get("median")
    out["epoch_change"] = (a - b) / a if a and b else None
    a, b = out["plain"]["fit_s"].get("median"), out["patched"]["fit_s"].get("median")
    out["fit_change"] = (a - b) / a if a and b else None
    return out


def table(result: dict) -> str:
    lines = [f"{'variant':8} {'epoch s (median, min-max)':>28} {'fit s (median, min-max)':>28} "
             f"{'loader wait':>12}"]
    for variant in ("plain", "patched"):
        v = result[variant]
        e, f, w = v["epoch_s"], v["fit_s"], v["loader_wait_share"]
        lines.append(f"{variant:8} {e['median']:10.2f} ({e['min']:.2f}-{e['max']:.2f}){'':6} "
                     f"{f['median']:10.1f} ({f['min']:.1f}-{f['max']:.1f}){'':6} "
                     f"{100 * w['median']:11.0f}%" if e and f and w else f"{variant:8} (no clean epochs)")
    if result["epoch_change"] is not None:
        lines.append(f"patched: epochs {100 * result['epoch_change']:+.1f}% faster, fits "
                     f"{100 * result['fit_change']:+.1f}% faster (medians)")
    lines.append("final losses and metrics: " + ("IDENTICAL in every fit" if result["identical"] else "DIFFER"))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="dota-obb")
    p.add_argument("--model", help="the recipe's model YAML by default")
    p.add_argument("--images", type=int)
    p.add_argument("--imgsz", type=int)
    p.add_argument("--classes", type=int)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--pairs", type=int, default=3, help="pairs of fits, plain and patched (at least 1)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--cache", default="false", help="the peer's cache= (false, true or ram, disk)")
    p.add_argument("--device", default="0", help="as the peer's device= takes it (0, cpu)")
    p.add_argument("--amp", default="bf16", help="the peer's amp= (bf16; false on the CPU)")
    p.add_argument("--backend", default="auto", help="patch()'s backend")
    p.add_argument("--folder", help="where to write the dataset and the runs (default: a temporary folder)")
    p.add_argument("--out", help="write the record (environment, arguments, every fit, the summary) as JSON")
    p.add_argument("--run", choices=("plain", "patched"), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--project", help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    args = p.parse_args()
    recipe = RECIPES[args.recipe]
    args.model = args.model or recipe.model
    args.imgsz = args.imgsz or recipe.imgsz
    if args.run:
        fit(args)
        return 0
    if args.pairs < 1 or args.epochs < 1:
        p.error("--pairs and --epochs: at least 1")

    from lucid_assign.bench import environment
    from lucid_assign.synthetic import write_yolo_dataset

    images = args.images or recipe.images
    classes = args.classes or recipe.classes
    counts = object_counts(recipe.counts, images)
    folder = os.path.abspath(args.folder or tempfile.mkdtemp(prefix="lucid-fit-"))
    t = time.time()
    data = write_yolo_dataset(os.path.join(folder, "data"), images=images, img_size=args.imgsz, num_classes=classes,
                              obb=recipe.obb, seed=0, image_ext="jpg", counts=counts)
    print(f"{args.recipe}: {images} images at {args.imgsz} px, objects per image median "
          f"{statistics.median(counts):g}, max {max(counts)}, written in {time.time() - t:.1f} s to {data}",
          flush=True)
    project = os.path.join(folder, "runs")
    base = [sys.executable, os.path.abspath(__file__), "--recipe", args.recipe, "--data", data, "--project", project,
            "--model", args.model, "--imgsz", str(args.imgsz), "--batch", str(args.batch), "--epochs",
            str(args.epochs), "--workers", str(args.workers), "--cache", args.cache, "--device", args.device,
            "--amp", args.amp, "--backend", args.backend]
    fits = []
    for pair in range(args.pairs):
        for variant in ("plain", "patched") if pair % 2 == 0 else ("patched", "plain"):
            name = f"{variant}-{pair}"
            out, wall = run_logged(base + ["--run", variant, "--name", name], os.path.join(folder, f"{name}.log"))
            if out.returncode != 0:
                return out.returncode
            epochs, final = read_results(os.path.join(project, name, "results.csv"))
            with open(os.path.join(project, name, "waits.json")) as f:
                waits = json.load(f)
            fits.append(dict(variant=variant, pair=pair, wall_s=wall, epochs=epochs, waits=waits, final=final))
            print(f"[{name}] fit {wall:.1f} s; epochs {', '.join(f'{e:.2f}' for e in epochs)} s; loader waits "
                  f"{', '.join(f'{w:.2f}' for w in waits)} s", flush=True)
    result = summary(fits)
    print(table(result))
    if args.out:
        # the arguments as given, without this machine's paths (and the children's own)
        given = {k: v for k, v in vars(args).items() if k not in ("folder", "out", "run", "data", "project", "name")}
        record = dict(environment=environment(), args=given, counts=counts, fits=fits, summary=result)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
