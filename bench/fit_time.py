"""Complete fits with the peer trainer (ultralytics), plain and patched, alternating: the training time a user sees.

    python bench/fit_time.py --recipe dota-obb --cache ram --workers 12 --out docs/bench-fit-dota-obb.json
    python bench/fit_time.py --recipe dense-obb --cache ram --workers 12 --folder /tmp/fit --resume --out F.json
    python bench/fit_time.py --recipe dota-obb --device cpu --amp false --images 8 --imgsz 128 --epochs 2 --pairs 1

Writes a synthetic dataset (noise images, DOTA-like objects; nothing downloaded), then runs
``YOLO("<model>.yaml").train(...)`` (``RTDETR(...)`` for RT-DETR) to the end, each fit in a process of its own:
unpatched and after ``lucid_assign.integrations.ultralytics.patch()``, alternating (pair k starts with the plain fit
when k is even, with the patched one when k is odd). Validation runs after the last epoch only, as the trainer does
with ``val=False``, on the first --val-images images.

Per variant it reports the median and the range of:
- the whole process (the child's wall time: interpreter start, imports, the model's build, the dataset's caching, the
  epochs, the final validation), and the complete fit (the ``train()`` call);
- the epochs after the first (which holds the start; the last holds the final validation and is left out when there
  are more than two), from the trainer's results.csv;
- the train loop's share of the process: the epochs' loops (from the trainer's epoch-start to its epoch-end callback)
  over the process's wall time. A recipe sized like a real fit has 80% or more; raise --epochs where it has less;
- the share of the loop spent waiting for the data loader (from a batch's end to the next batch's start). A loop that
  waits for most of an epoch is bound by the loader (raise --workers, or --cache ram); one that hardly waits, by the
  GPU;
- what ``patch()`` added to the patched process's start (its import and checks, after the imports every fit makes).

Last, the end state of every fit compared byte for byte (SHA-256 digests): every loss value of every step (the loss
and its items), and the model, optimiser, EMA and scheduler state dicts after the fit; and results.csv's last row
(without its time column). It exits 1 when they differ, unless the plain fits already differ among themselves (a
trainer that is not deterministic on this device: then nothing can be compared byte for byte, and it says so) or the
fits ran on the CPU (whose contract is a stated tolerance, docs/design.md: it says where they differ).

--out writes the record (environment, arguments, every fit, the summary) as JSON after each fit; with --resume an
existing record of the same arguments and code is continued up to --pairs pairs (a run stopped between fits goes on
where it stopped; --max-fits N stops after N fits), and with --folder the dataset written there is reused.

Recipes (--images, --imgsz, --model, --classes and --epochs override them); 64 steps an epoch or more at batch 16:
  dota-obb      yolo26n-obb, 1024 px, 15 classes, 1,024 images, 20 epochs; objects per image log-normal with a
                median of 60, one image of 1,200 (the tail past 1,000)
  dense-obb     yolo26n-obb, 1024 px, 15 classes, 1,024 images of 1,000-2,000 objects, 12 epochs
  coco-hbb      yolo26n, 640 px, 80 classes, 2,048 images, 12 epochs; log-normal with a median of 4, one image of 60
  rtdetr        the peer's rtdetr-l, 640 px, 80 classes, 1,024 images, 10 epochs, objects as coco-hbb
  rtdetr-dense  the same (10 epochs) with objects log-normal around a median of 60, one image of 600
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import digest, read_results, run_logged  # noqa: E402


class Recipe(NamedTuple):
    model: str
    imgsz: int
    classes: int
    obb: bool
    images: int
    epochs: int
    counts: tuple  # ("lognormal", median, sigma, tail) or ("uniform", low, high)


RECIPES = {
    "dota-obb": Recipe("yolo26n-obb.yaml", 1024, 15, True, 1024, 20, ("lognormal", 60, 1.2, 1200)),
    "dense-obb": Recipe("yolo26n-obb.yaml", 1024, 15, True, 1024, 12, ("uniform", 1000, 2000)),
    "coco-hbb": Recipe("yolo26n.yaml", 640, 80, False, 2048, 12, ("lognormal", 4, 1.0, 60)),
    "rtdetr": Recipe("rtdetr-l.yaml", 640, 80, False, 1024, 10, ("lognormal", 4, 1.0, 60)),
    "rtdetr-dense": Recipe("rtdetr-l.yaml", 640, 80, False, 1024, 10, ("lognormal", 60, 1.0, 600)),
}
STATES = ("losses", "model", "optimizer", "ema", "scheduler")  # compared byte for byte, with results.csv's last row


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

def end_states(trainer) -> dict:
    """The trainer's state after the fit, as its checkpoints hold it: model, optimiser (with the AMP scaler's), EMA
    (weights and update count) and scheduler."""
    scaler = getattr(trainer, "scaler", None)
    return dict(model=trainer.model.state_dict(),
                optimizer=dict(optimizer=trainer.optimizer.state_dict(),
                               scaler=scaler.state_dict() if scaler is not None and scaler.is_enabled() else None),
                ema=dict(ema=trainer.ema.ema.state_dict(), updates=trainer.ema.updates) if trainer.ema else None,
                scheduler=trainer.scheduler.state_dict())


def fit(args) -> None:
    """One complete fit in this process; what it measured goes to <project>/<name>/fit.json."""
    import torch
    import torch._dynamo  # noqa: F401  every fit imports it before its first step; here first, in both variants
    import ultralytics

    # the peer builds its RT-DETR models with their own class (YOLO(...) does not take their YAML)
    model = (ultralytics.RTDETR if "rtdetr" in os.path.basename(args.model) else ultralytics.YOLO)(args.model)
    patch_s = None
    if args.run == "patched":  # after the model's build, which imports what patch() reads: its time is its own
        t = time.perf_counter()
        from lucid_assign.integrations import ultralytics as integ

        integ.patch(args.backend)
        patch_s = time.perf_counter() - t
    waits, loops, losses, marks, states = [], [], [], {}, {}

    def epoch_start(trainer):
        waits.append(0.0)
        marks["epoch"] = marks["free"] = time.perf_counter()

    def batch_start(trainer):
        waits[-1] += time.perf_counter() - marks["free"]

    def batch_end(trainer):
        marks["free"] = time.perf_counter()
        # kept where they are and read once at the end: a read per step would add a wait the trainer does not make
        items = trainer.loss_items.values() if isinstance(trainer.loss_items, dict) else [trainer.loss_items]
        losses.append(torch.cat([t.detach().reshape(-1) for t in (trainer.loss, *items)]))

    def epoch_end(trainer):
        loops.append(time.perf_counter() - marks["epoch"])

    def train_end(trainer):
        states.update({k: digest(v) for k, v in end_states(trainer).items()})

    for event, callback in (("on_train_epoch_start", epoch_start), ("on_train_batch_start", batch_start),
                            ("on_train_batch_end", batch_end), ("on_train_epoch_end", epoch_end),
                            ("on_train_end", train_end)):
        model.add_callback(event, callback)
    amp = {"false": False, "true": True}.get(args.amp.lower(), args.amp)
    cache = {"false": False, "true": True}.get(args.cache.lower(), args.cache)
    t = time.perf_counter()
    model.train(data=args.data, device=args.device, epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                workers=args.workers, cache=cache, amp=amp, plots=False, val=False, seed=0, deterministic=True,
                project=args.project, name=args.name, exist_ok=True)
    fit_s = time.perf_counter() - t
    steps = torch.stack(losses).cpu()
    states["losses"] = digest(steps)
    with open(os.path.join(args.project, args.name, "fit.json"), "w") as f:
        json.dump(dict(fit_s=fit_s, patch_s=patch_s, loops=loops, waits=waits, steps=len(losses),
                       last_loss=steps[-1].tolist(), digests=states), f)


# ---- the benchmark (the parent process) -------------------------------------------------------------------------

def clean(epochs: list) -> list:
    """The epochs after the first (the start), and before the last (the final validation) when there are more
    than two."""
    return epochs[1:-1] if len(epochs) > 2 else epochs[1:] or epochs


def spread(values: list) -> dict:
    return dict(median=statistics.median(values), min=min(values), max=max(values)) if values else {}


def _agree(fits: list) -> list:
    """The parts of the end state (STATES and "final") in which the fits differ."""
    keys = [k for k in STATES if len({f["digests"].get(k) for f in fits}) > 1]
    return keys + (["final"] if len({json.dumps(f["final"], sort_keys=True) for f in fits}) > 1 else [])


def summary(fits: list, device: str) -> dict:
    """Per variant the spreads of the fits' times and shares; which parts of the end state differ (among all fits,
    and among the plain ones); the patched fits' gain by the medians."""
    out = {}
    for variant in ("plain", "patched"):
        mine = [f for f in fits if f["variant"] == variant]
        epochs = [e for f in mine for e in clean(f["epochs"])]
        waits = [w / e for f in mine for w, e in zip(f["waits"], f["loops"]) if e > 0]
        out[variant] = dict(process_s=spread([f["wall_s"] for f in mine]), fit_s=spread([f["fit_s"] for f in mine]),
                            epoch_s=spread(epochs), loop_share=spread([sum(f["loops"]) / f["wall_s"] for f in mine]),
                            loader_wait_share=spread(waits),
                            patch_s=spread([f["patch_s"] for f in mine if f["patch_s"] is not None]))
    out["differ"] = _agree(fits)
    out["identical"] = not out["differ"]
    out["bitwise"] = str(device).lower() != "cpu"  # the contract: bit for bit on CUDA, a stated tolerance on the CPU
    plain = [f for f in fits if f["variant"] == "plain"]
    out["plain_differ"] = _agree(plain) if len(plain) > 1 else None
    out["plain_agree"] = None if out["plain_differ"] is None else not out["plain_differ"]
    for key in ("process_s", "fit_s", "epoch_s"):
        a, b = out["plain"][key].get("median"), out["patched"][key].get("median")
        out[key.removesuffix("_s") + "_change"] = (a - b) / a if a and b else None
    return out


def _row(name: str, v: dict, scale: float = 1.0, unit: str = " s") -> str:
    if not v:
        return f"{name:>34}: -"
    return f"{name:>34}: {scale * v['median']:9.2f}{unit} ({scale * v['min']:.2f}-{scale * v['max']:.2f})"


def table(result: dict) -> str:
    lines = []
    for variant in ("plain", "patched"):
        v = result[variant]
        lines += [f"{variant}:", _row("whole process", v["process_s"]), _row("complete fit (train())", v["fit_s"]),
                  _row("an epoch (after the first)", v["epoch_s"]),
                  _row("train loop, share of the process", v["loop_share"], 100, "%"),
                  _row("loader wait, share of the loop", v["loader_wait_share"], 100, "%")]
        if v["patch_s"]:
            lines.append(_row("patch() at the start", v["patch_s"]))
    if result["process_change"] is not None:
        lines.append(f"patched, faster by (medians): the whole process {100 * result['process_change']:+.1f}%, the "
                     f"complete fit {100 * result['fit_change']:+.1f}%, an epoch {100 * result['epoch_change']:+.1f}%")
    if result["identical"]:
        lines.append(f"end state (every loss value, {', '.join(STATES[1:])}, results.csv): IDENTICAL in every fit")
    elif not result["bitwise"]:
        lines.append(f"end state: differs in {', '.join(result['differ'])}; on the CPU the patched assigners' scores "
                     "may differ from the peer's in the last bit (docs/design.md), so a CPU fit is not expected to "
                     "end byte for byte the same")
    elif result["plain_agree"] is False:
        lines.append(f"end state: the plain fits differ among themselves ({', '.join(result['plain_differ'])}): the "
                     "trainer is not deterministic here, so no fit can be compared byte for byte")
    else:
        lines.append(f"end state: DIFFER in {', '.join(result['differ'])}")
    return "\n".join(lines)


GIVEN = ("recipe", "model", "images", "imgsz", "classes", "epochs", "batch", "workers", "cache", "device", "amp",
         "backend", "val_images")  # the record's arguments (those that make the fits what they are), and --pairs
SAME_MACHINE = ("torch", "cuda", "gpu", "cpu", "python", "lucid_assign", "ultralytics", "code")


def code_digest() -> str:
    """What the fits run, as one digest: the imported package's Python sources (with its build record: torch, CUDA,
    architectures; not the commit an archived tree names), this script, and the extension: its sources where the
    package runs from a checkout (csrc/ beside it), so that the same commit rebuilt for the same torch in a new
    session's checkout goes on; else its binary. A record resumes only with the same code."""
    import hashlib

    import lucid_assign

    root = os.path.dirname(os.path.abspath(lucid_assign.__file__))
    top = os.path.dirname(root)
    csrc = os.path.join(top, "csrc")
    kinds = (".py",) if os.path.isdir(csrc) else (".py", ".so", ".pyd")
    files = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names
                   if n.endswith(kinds) and n != "_archive.py" and "__pycache__" not in d)
    if os.path.isdir(csrc):
        files += sorted(os.path.join(d, n) for d, _, names in os.walk(csrc) for n in names
                        if n.endswith((".h", ".cuh", ".cpp", ".cu")))
    h = hashlib.sha256()
    for path in files + [os.path.abspath(__file__)]:
        h.update(os.path.relpath(path, top).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _resumed(args, given: dict, environment: dict, order: list) -> list:
    """The fits of an existing record at --out when --resume is given and the record is of these arguments, this
    machine and this code; [] when there is none."""
    if not (args.resume and os.path.exists(args.out)):
        return []
    with open(args.out) as f:
        record = json.load(f)
    theirs = {k: v for k, v in record["args"].items() if k != "pairs"}
    if theirs != {k: v for k, v in given.items() if k != "pairs"}:
        raise SystemExit(f"--resume: {args.out} holds fits of other arguments ({theirs})")
    other = [k for k in SAME_MACHINE if record["environment"].get(k) != environment.get(k)]
    if other:
        raise SystemExit(f"--resume: {args.out} was made with another {', '.join(other)}")
    fits = record["fits"]
    if [(f["pair"], f["variant"]) for f in fits] != order[:len(fits)]:
        raise SystemExit(f"--resume: {args.out} holds fits out of this run's order")
    return fits


def _dataset(folder: str, recipe: Recipe, args, images: int, classes: int, counts: list) -> str:
    """The dataset's data YAML, written under folder/data, or the one there when it was written with these
    settings."""
    from lucid_assign.synthetic import write_yolo_dataset

    root = os.path.join(folder, "data")
    want = dict(obb=recipe.obb, imgsz=args.imgsz, classes=classes, counts=counts, val_images=args.val_images)
    marker = os.path.join(root, "settings.json")
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == want:
                return os.path.join(root, "data.yaml")
    shutil.rmtree(root, ignore_errors=True)
    t = time.time()
    data = write_yolo_dataset(root, images=images, img_size=args.imgsz, num_classes=classes, obb=recipe.obb, seed=0,
                              image_ext="jpg", counts=counts, val_images=args.val_images)
    with open(marker, "w") as f:
        json.dump(want, f)
    print(f"the dataset written in {time.time() - t:.1f} s to {root}", flush=True)
    return data


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="dota-obb")
    p.add_argument("--model", help="the recipe's model YAML by default")
    p.add_argument("--images", type=int)
    p.add_argument("--imgsz", type=int)
    p.add_argument("--classes", type=int)
    p.add_argument("--epochs", type=int, help="the recipe's by default")
    p.add_argument("--val-images", type=int,
                   help="the final validation's images: the first this many (default 64, at most --images)")
    p.add_argument("--pairs", type=int, default=3, help="pairs of fits, plain and patched (at least 1)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--cache", default="false", help="the peer's cache= (false, true or ram, disk)")
    p.add_argument("--device", default="0", help="as the peer's device= takes it (0, cpu)")
    p.add_argument("--amp", default="bf16", help="the peer's amp= (bf16; false on the CPU)")
    p.add_argument("--backend", default="auto", help="patch()'s backend")
    p.add_argument("--folder", help="where to write the dataset and the runs (default: a temporary folder)")
    p.add_argument("--out", help="write the record (environment, arguments, every fit, the summary) as JSON")
    p.add_argument("--resume", action="store_true", help="continue the record at --out (same arguments)")
    p.add_argument("--max-fits", type=int, help="run at most this many fits now (the record stays open for --resume)")
    p.add_argument("--run", choices=("plain", "patched"), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--project", help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    args = p.parse_args()
    recipe = RECIPES[args.recipe]
    args.model = args.model or recipe.model
    args.imgsz = args.imgsz or recipe.imgsz
    args.epochs = args.epochs or recipe.epochs
    if args.run:
        fit(args)
        return 0
    images = args.images or recipe.images
    classes = args.classes or recipe.classes
    if args.pairs < 1 or args.epochs < 1:
        p.error("--pairs and --epochs: at least 1")
    args.val_images = args.val_images or min(64, images)
    if not 1 <= args.val_images <= images:
        p.error(f"--val-images: between 1 and the images ({images})")
    if args.resume and not args.out:
        p.error("--resume: needs --out")
    if args.max_fits is not None and args.max_fits < 1:
        p.error("--max-fits: at least 1")

    from lucid_assign.bench import environment

    env = environment() | dict(code=code_digest())
    given = {k: getattr(args, k) for k in GIVEN} | dict(images=images, classes=classes, pairs=args.pairs)
    order = [(pair, variant) for pair in range(args.pairs)
             for variant in (("plain", "patched") if pair % 2 == 0 else ("patched", "plain"))]
    fits = _resumed(args, given, env, order)
    counts = object_counts(recipe.counts, images)
    folder = os.path.abspath(args.folder or tempfile.mkdtemp(prefix="lucid-fit-"))
    print(f"{args.recipe}: {images} images at {args.imgsz} px ({-(-images // args.batch)} steps an epoch at batch "
          f"{args.batch}), objects per image median {statistics.median(counts):g}, max {max(counts)}; {args.epochs} "
          f"epochs; {len(fits)} of {len(order)} fits done", flush=True)
    data = _dataset(folder, recipe, args, images, classes, counts)
    project = os.path.join(folder, "runs")
    base = [sys.executable, os.path.abspath(__file__), "--recipe", args.recipe, "--data", data, "--project", project,
            "--model", args.model, "--imgsz", str(args.imgsz), "--batch", str(args.batch), "--epochs",
            str(args.epochs), "--workers", str(args.workers), "--cache", args.cache, "--device", args.device,
            "--amp", args.amp, "--backend", args.backend]
    for pair, variant in order[len(fits):][:args.max_fits]:
        name = f"{variant}-{pair}"
        shutil.rmtree(os.path.join(project, name), ignore_errors=True)  # a fit stopped before: its rows would stay
        out, wall = run_logged(base + ["--run", variant, "--name", name], os.path.join(folder, f"{name}.log"))
        if out.returncode != 0:
            return out.returncode
        epochs, final = read_results(os.path.join(project, name, "results.csv"))
        with open(os.path.join(project, name, "fit.json")) as f:
            child = json.load(f)
        fits.append(dict(variant=variant, pair=pair, wall_s=wall, epochs=epochs, final=final, **child))
        print(f"[{name}] process {wall:.1f} s, fit {child['fit_s']:.1f} s, the loop {sum(child['loops']):.1f} s "
              f"({100 * sum(child['loops']) / wall:.0f}% of the process), waiting for the loader "
              f"{sum(child['waits']):.2f} s; epochs {', '.join(f'{e:.2f}' for e in epochs)} s"
              + (f"; patch() {child['patch_s']:.3f} s" if child["patch_s"] is not None else ""), flush=True)
        if args.out:  # after each fit: a run stopped later keeps what it measured (--resume goes on from it)
            record = dict(environment=env, args=given, counts=counts, fits=fits, summary=summary(fits, args.device))
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1)
    result = summary(fits, args.device)
    print(table(result))
    if len(fits) < len(order):
        print(f"{len(fits)} of {len(order)} fits done: --resume goes on", flush=True)
        return 0
    return exit_status(result)


def exit_status(result: dict) -> int:
    """1 where the fits should have ended byte for byte the same and did not: on CUDA, with plain fits that agree."""
    return 0 if result["identical"] or not result["bitwise"] or result["plain_agree"] is False else 1


if __name__ == "__main__":
    sys.exit(main())
