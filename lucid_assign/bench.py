"""Benchmark machinery shared by ``lucid-assign bench`` and the pytest-benchmark suite in bench/.

A case is a kind (HBB at 640 px with 80 classes, OBB at 1024 px with 15 classes, as in the peer's detect and OBB
models, or pose: HBB at 640 px with 17 keypoints per object, ``pose_batch``, or seg: HBB at 640 px with masks, 32
bfloat16 prototypes at 160 x 160, ``seg_batch``), a batch size and a number of objects per image, on one device.
The scene is DOTA-like (``dota_like_batch``) or, with a dense preset, many small objects (``dense_batch``), where a
number of objects may be a (low, high) range drawn per image. A backend is the reference, the compiled kernel, or
the peer trainer's assigner (``ultralytics``) when it is installed.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from . import api, dispatch, ops, reference
from .doctor import installed_version, peer_version
from .reference import INPUTS, POSE_INPUTS, SEG_INPUTS
from .synthetic import dense_batch, dota_like_batch, pose_batch, seg_batch

KINDS = {
    "hbb": dict(img_size=640, num_classes=80, obb=False),  # 8,400 anchors
    "obb": dict(img_size=1024, num_classes=15, obb=True),  # 21,504 anchors
    "pose": dict(img_size=640, num_classes=80, obb=False),  # 8,400 anchors, 17 keypoints
    "seg": dict(img_size=640, num_classes=80, obb=False),  # 8,400 anchors, masks at 160 x 160
}
# Dense scenes: xView-like (satellite, up to ~5,000 objects an image; the peer's assigner runs out of memory there
# and falls back to the CPU) and the same density of oriented objects at the OBB size.
PRESETS = {
    "xview": dict(kind="hbb", batch=128, classes=60, objects=(2500, 5000)),
    "dense-obb": dict(kind="obb", batch=16, classes=15, objects=(2500, 5000)),
}
TOPK = 10
# Dense backends (the reference, the peer, the dense pass ops) build several (B, M, A) tensors; above this many
# elements on the CPU they take minutes and tens of GiB, so the benchmark skips them there and says so.
DENSE_CPU_LIMIT = int(os.environ.get("LUCID_BENCH_DENSE_CPU_LIMIT", 120_000_000))
# measured order of the peak per (B, M, A) element on the GPU: the reference ~40 bytes, the peer 17-24
DENSE_BYTES_PER_ELEMENT = {"reference": 40, "peer": 24}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def num_classes_of(kind: str, classes: int | None = None) -> int:
    return classes or KINDS[kind]["num_classes"]


def objects_label(objects) -> str:
    """An object count, or a (low, high) range of them, as text."""
    return f"{objects[0]}-{objects[1]}" if isinstance(objects, (tuple, list)) else str(objects)


@functools.lru_cache(maxsize=4)
def _host_scene(kind: str, batch: int, objects, seed: int, classes: int | None = None, dense: bool = False):
    spec = dict(KINDS[kind], num_classes=num_classes_of(kind, classes))
    if kind == "pose":
        return pose_batch(batch=batch, objects=objects, seed=seed, img_size=spec["img_size"],
                          num_classes=spec["num_classes"])
    if kind == "seg":  # coefficients and prototypes in bfloat16, as the peer trainer's model gives them under autocast
        return seg_batch(batch=batch, objects=objects, seed=seed, img_size=spec["img_size"],
                         num_classes=spec["num_classes"], mask_dtype=torch.bfloat16)
    make = dense_batch if dense else dota_like_batch
    return make(batch=batch, objects=objects, seed=seed, **spec)


def scene(kind: str, batch: int, objects, device="cpu", seed: int = 0, copies: int = 1,
          classes: int | None = None, dense: bool = False):
    """``copies`` independent copies of one seeded batch on ``device`` (rotated between timed calls). ``objects``: a
    count per image, or a (low, high) range drawn per image; ``dense``: a dense scene (dense_batch)."""
    host = _host_scene(kind, batch, tuple(objects) if isinstance(objects, list) else objects, seed, classes, dense)
    out = []
    for _ in range(copies):
        out.append({k: (v.to(device, copy=True) if isinstance(v, torch.Tensor) else v) for k, v in host.items()})
    return out


def peer_assigner(kind: str, classes: int | None = None, sigmas=None):
    """The peer's assigner for this kind (pose: with ``sigmas``), or None when ultralytics is not installed."""
    try:
        from ultralytics.utils import tal
    except ImportError:
        return None
    kw = dict(topk=TOPK, num_classes=num_classes_of(kind, classes), alpha=0.5, beta=6.0, stride=[8, 16, 32])
    if kind == "pose":
        return tal.PoseTaskAlignedAssigner(sigmas, **kw)
    if kind == "seg":
        return tal.SegTaskAlignedAssigner(**kw)
    cls = tal.RotatedTaskAlignedAssigner if KINDS[kind]["obb"] else tal.TaskAlignedAssigner
    return cls(**kw)


def dense_skip(backend: str, device, batch: int, objects: int, anchors: int) -> str | None:
    """Why a dense backend is not run at this size (``objects``: the rows per image, padding included) on this
    device, or None."""
    if backend == "kernel":
        return None
    elements = batch * objects * anchors
    if torch.device(device).type == "cpu":
        if elements > DENSE_CPU_LIMIT:
            return f"{backend} builds (B, M, A) = {elements:,} element tensors; above {DENSE_CPU_LIMIT:,} on the CPU"
        return None
    free, _ = torch.cuda.mem_get_info(device)
    need = elements * DENSE_BYTES_PER_ELEMENT.get(backend, 40)
    if need > free:
        return f"{backend} would need about {need / 2**30:.0f} GiB of GPU memory"
    return None


def assign_runner(backend: str, kind: str, classes: int | None = None):
    """A callable batch -> outputs for ``backend`` ("reference", "kernel", "peer"), or a string saying why not."""
    kw = dict(topk=TOPK, num_classes=num_classes_of(kind, classes), alpha=0.5, beta=6.0, stride=(8, 16, 32))
    if kind == "pose":
        return _pose_runner(backend, classes, kw)
    if kind == "seg":
        if backend == "peer":
            peer = peer_assigner(kind, classes)
            if peer is None:
                return "ultralytics is not installed"
            return lambda b: peer(*(b[k] for k in INPUTS), **{k: b[k] for k in SEG_INPUTS})
        return lambda b: api.assign_seg(*(b[k] for k in INPUTS + SEG_INPUTS), backend=backend, **kw)
    if backend == "peer":
        peer = peer_assigner(kind, classes)
        if peer is None:
            return "ultralytics is not installed"
        return lambda b: peer(*(b[k] for k in INPUTS))
    if backend == "kernel":
        return lambda b: api.assign(*(b[k] for k in INPUTS), backend="kernel", **kw)
    return lambda b: api.assign(*(b[k] for k in INPUTS), backend="reference", **kw)


def _pose_runner(backend: str, classes, kw):
    if backend == "peer":
        if peer_assigner("pose", classes) is None:
            return "ultralytics is not installed"
        peers = {}  # one per sigmas tensor (its device)

        def run_peer(b):
            peer = peers.get(id(b["sigmas"])) or peers.setdefault(id(b["sigmas"]),
                                                                   peer_assigner("pose", classes, b["sigmas"]))
            return peer(*(b[k] for k in INPUTS), b["anc_strides"], pd_kpts=b["pd_kpts"], gt_kpts=b["gt_kpts"])

        return run_peer
    return lambda b: api.assign_pose(*(b[k] for k in INPUTS + POSE_INPUTS), backend=backend, **kw)


def kernel_unavailable(device) -> str | None:
    """Why the kernel cannot run the benchmark's (float32) scenes on this device, or None."""
    return dispatch.device_unsupported(torch.device(device).type)


def pass_runner(op: str, backend: str, batch: dict):
    """A no-argument callable running one pass (``op``) with ``backend`` ("reference" or "kernel") on ``batch``."""
    anc, gt, mask = batch["anc_points"], batch["gt_bboxes"], batch["mask_gt"]
    stride_val = reference.stride_value(batch["stride"])
    lib = ops if backend == "kernel" else reference
    if op == "points_in_boxes":
        return lambda: lib.points_in_boxes(anc, gt, mask, stride_val)
    cand = reference.points_in_boxes(anc, gt, mask, stride_val) & mask.bool()
    if op == "pair_overlaps":
        b, m, a = cand.nonzero(as_tuple=True)
        g, p = gt[b, m], batch["pd_bboxes"][b, a]
        return lambda: lib.pair_overlaps(g, p)
    args = (batch["pd_scores"], batch["pd_bboxes"], batch["gt_labels"], gt, cand)
    if op == "box_metrics":
        return lambda: lib.box_metrics(*args, 0.5, 6.0)
    if op == "resolve_conflicts":
        align, overlaps = reference.box_metrics(*args, 0.5, 6.0)
        pos = reference.topk_mask(align, TOPK) & cand
        return lambda: lib.resolve_conflicts(pos, overlaps)
    raise ValueError(f"unknown pass {op!r}")


def _rss_peak_reset() -> int | None:
    """Return freed heap pages to the system, reset the peak resident set, and return the resident set now."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed blocks resident otherwise
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_status("VmRSS")
    except OSError:
        return None


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_memory(fn, device) -> int | None:
    """Bytes one call adds at its peak (GPU: caching allocator; CPU: the process's peak resident set)."""
    if torch.device(device).type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        sync(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del out
        return peak
    base = _rss_peak_reset()
    out = fn()
    if base is None:
        return None
    peak = _proc_status("VmHWM") - base
    del out
    return peak


WARMUP_MAX = 30  # warm-up calls at most, when first calls stay slow


def time_calls(fns, device, reps: int, warmup: int = 1) -> list:
    """Seconds per call; calls cycle through ``fns`` (one per input copy) so caches do not flatter.

    First calls pay what later ones do not (lazy loading of GPU code, the allocator's first blocks, library planning
    for new shapes): before timing, every copy is called ``warmup`` times, and calls go on (up to WARMUP_MAX) while
    their times still fall (a call under 0.8 times the one before) or a call takes over 1.25 times the fastest so far,
    so that even ``reps=1`` times a warm call."""
    use_events = torch.device(device).type == "cuda"

    def timed(fn) -> float:
        if use_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    sync(device)
    warm = [timed(fns[i % len(fns)]) for i in range(max(1, warmup) * len(fns))]
    while len(warm) < WARMUP_MAX and ((len(warm) > 1 and warm[-1] < 0.8 * warm[-2]) or warm[-1] > 1.25 * min(warm)):
        warm.append(timed(fns[len(warm) % len(fns)]))
    sync(device)
    return [timed(fns[i % len(fns)]) for i in range(reps)]


def environment() -> dict:
    env = dict(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        cpu=platform.processor() or platform.machine(),
        cpu_threads=torch.get_num_threads(),
        python=sys.version.split()[0],
        date=time.strftime("%Y-%m-%d"),
        lucid_assign=installed_version(),
        ultralytics=peer_version(),
    )
    env["commit"] = source_commit()
    return env


def source_commit() -> str | None:
    """The commit of the source tree this package runs from: git's where the package's parent folder is a checkout,
    the archive's where ``git archive`` made the tree (lucid_assign/_archive.py), else None (an installed wheel:
    a checkout around site-packages is not its source)."""
    from ._archive import COMMIT

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, ".git")):
        return None if COMMIT.startswith("$") else COMMIT
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int, width: int = 30):
        self.total, self.width, self.done = total, width, 0

    def step(self, label: str) -> None:
        self.done += 1
        filled = int(self.width * self.done / max(self.total, 1))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label:<48.48}")
        sys.stderr.flush()
        if self.done == self.total:
            sys.stderr.write("\n")


def run(kind: str, batch: int, objects_list, device, backends, reps: int, seed: int = 0, progress: bool = True,
        classes: int | None = None, dense: bool = False):
    """Time ``assign`` for each backend and object count (or range). Returns a list of result dicts."""
    results = []
    bar = Progress(len(objects_list) * len(backends)) if progress else None
    for objects in objects_list:
        copies = scene(kind, batch, objects, device, seed, copies=3, classes=classes, dense=dense)
        n_anchors, rows = copies[0]["anc_points"].shape[0], copies[0]["gt_bboxes"].shape[1]
        for backend in backends:
            row = dict(kind=kind, batch=batch, objects=objects, device=str(device), backend=backend,
                       anchors=n_anchors, classes=num_classes_of(kind, classes), scene="dense" if dense else "dota")
            why = kernel_unavailable(device) if backend == "kernel" else dense_skip(backend, device, batch, rows,
                                                                                   n_anchors)
            runner = assign_runner(backend, kind, classes)
            if why is None and isinstance(runner, str):
                why = runner
            if why is not None:
                row["skipped"] = why
            else:
                fns = [functools.partial(runner, b) for b in copies]
                row["peak_bytes"] = peak_memory(fns[0], device)
                times = time_calls(fns, device, reps)
                row.update(median_s=statistics.median(times), min_s=min(times), max_s=max(times), reps=reps)
            results.append(row)
            if bar:
                bar.step(f"{kind} b{batch} m{objects_label(objects)} {backend}")
    return results


# ---- the linear sum assignment ----------------------------------------------------------------------------------
# Backends: the compiled op ("kernel"), the public function (lucid_assign.linear_sum_assignment: its checks and its
# status read), the peer matcher's path ("scipy": the cost copied to the host, then SciPy once
# per problem) and torch-linear-assignment ("tla", package torch-hungarian: a Triton kernel of SciPy's algorithm),
# each where installed; the costs float32, uniform random or a DETR trainer's (synthetic.detr_costs: an untrained
# model's near ties, a partly trained one's), one seeded batch per copy.
LSAP_SHAPES = ((16, 300, 10), (16, 300, 50), (16, 300, 200))


def lsap_runner(backend: str):
    """A function of one cost batch for ``backend``, or why it cannot run (a string)."""
    if backend == "kernel":
        return lambda cost: ops.linear_sum_assignment(cost)
    if backend == "api":  # the public function: its checks, its status read (on CUDA, one synchronisation)
        from .matching import linear_sum_assignment

        return lambda cost: linear_sum_assignment(cost, backend="kernel")
    if backend == "reference":
        from . import lsap

        return lambda cost: lsap.linear_sum_assignment(cost)
    if backend == "scipy":
        try:
            from scipy.optimize import linear_sum_assignment
        except ImportError:
            return "SciPy is not installed"

        def run_scipy(cost):
            host = cost.cpu()  # the peer's matcher: the whole cost to the host, then one call per problem
            return [linear_sum_assignment(c) for c in host]

        return run_scipy
    if backend == "tla":
        try:
            from torch_linear_assignment import batch_linear_assignment
        except ImportError:
            return "torch-linear-assignment (pip install torch-hungarian) is not installed"
        return batch_linear_assignment
    return f"unknown backend {backend!r}"


def lsap_run(shapes, device, backends, reps: int, seed: int = 0, progress: bool = True,
             costs=("uniform",)) -> list:
    """Time each backend on each (batch, rows, columns) shape of each kind of costs (synthetic.DETR_COSTS); rows like
    run()'s."""
    from .synthetic import detr_costs

    results = []
    bar = Progress(len(shapes) * len(costs) * len(backends)) if progress else None
    for shape, kind in itertools.product(shapes, costs):
        if kind == "uniform":  # as the first records drew them
            g = torch.Generator().manual_seed(seed)
            copies = [torch.rand(shape, generator=g).to(device) for _ in range(3)]
        else:
            copies = [detr_costs(*shape, kind=kind, seed=seed + k).to(device) for k in range(3)]
        for backend in backends:
            row = dict(kind="lsap", shape="x".join(map(str, shape)), batch=shape[0], objects=shape[2],
                       costs=kind, device=str(device), backend=backend)
            runner = lsap_runner(backend)
            why = kernel_unavailable(device) if backend in ("kernel", "api") else None
            why = why or (runner if isinstance(runner, str) else None)
            if why is not None:
                row["skipped"] = why
            else:
                fns = [functools.partial(runner, c) for c in copies]
                times = time_calls(fns, device, reps)
                row.update(median_s=statistics.median(times), min_s=min(times), max_s=max(times), reps=reps)
            results.append(row)
            if bar:
                bar.step(f"lsap {row['shape']} {kind} {backend}")
    return results


def lsap_table(results) -> str:
    """Backends side by side per shape, with the op's speed-up over each (and the public function's, where timed)."""
    lines = [f"{'shape':>14} {'costs':<9} {'backend':<8} {'median ms':>10} {'min ms':>9} {'max ms':>9} "
             f"{'kernel faster':>14} {'api faster':>11}"]
    for case in dict.fromkeys((r["shape"], r.get("costs", "uniform")) for r in results):
        rows = [r for r in results if (r["shape"], r.get("costs", "uniform")) == case]
        ours = next((r["median_s"] for r in rows if r["backend"] == "kernel" and "median_s" in r), None)
        api = next((r["median_s"] for r in rows if r["backend"] == "api" and "median_s" in r), None)
        shape, kind = case
        for r in rows:
            if "median_s" not in r:
                lines.append(f"{shape:>14} {kind:<9} {r['backend']:<8} skipped: {r['skipped']}")
                continue
            others = r["backend"] not in ("kernel", "api")
            speedup = f"{r['median_s'] / ours:.1f}x" if ours and others else ""
            by_api = f"{r['median_s'] / api:.1f}x" if api and others else ""
            lines.append(f"{shape:>14} {kind:<9} {r['backend']:<8} {r['median_s'] * 1e3:10.3f} "
                         f"{r['min_s'] * 1e3:9.3f} {r['max_s'] * 1e3:9.3f} {speedup:>14} {by_api:>11}")
    return "\n".join(lines)


def table(results) -> str:
    """Backends side by side per object count, with speed-ups against the reference and the peer."""
    lines = [f"{'objects':>7} {'backend':<10} {'median ms':>10} {'min ms':>9} {'max ms':>9} {'peak MiB':>9} "
             f"{'vs reference':>12} {'vs peer':>8}"]
    by_objects = {}
    for r in results:
        by_objects.setdefault(objects_label(r["objects"]), {})[r["backend"]] = r
    for objects, rows in by_objects.items():
        ref, peer = rows.get("reference", {}), rows.get("peer", {})
        for backend, r in rows.items():
            if "skipped" in r:
                lines.append(f"{objects:>7} {backend:<10} skipped: {r['skipped']}")
                continue
            mem = f"{r['peak_bytes'] / 2**20:9.1f}" if r.get("peak_bytes") is not None else f"{'-':>9}"
            vs_ref = f"{ref['median_s'] / r['median_s']:11.1f}x" if "median_s" in ref else f"{'-':>12}"
            vs_peer = f"{peer['median_s'] / r['median_s']:7.1f}x" if "median_s" in peer else f"{'-':>8}"
            lines.append(f"{objects:>7} {backend:<10} {r['median_s'] * 1e3:10.3f} {r['min_s'] * 1e3:9.3f} "
                         f"{r['max_s'] * 1e3:9.3f} {mem} {vs_ref} {vs_peer}")
    return "\n".join(lines)


def plot(results, path: str, title: str) -> None:
    """PNG of time and peak memory against objects per image, log scales, one line per backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib (pip install matplotlib): {exc}")
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    backends = sorted({r["backend"] for r in results})
    for backend in backends:
        rows = [r for r in results if r["backend"] == backend and "median_s" in r]
        if not rows:
            continue
        xs = [max(r["objects"]) if isinstance(r["objects"], (list, tuple)) else r["objects"] for r in rows]
        ax_t.plot(xs, [r["median_s"] * 1e3 for r in rows], marker="o", label=backend)
        mem = [(r["objects"], r["peak_bytes"] / 2**20) for r in rows if r.get("peak_bytes")]
        if mem:
            ax_m.plot(*zip(*mem), marker="o", label=backend)
    for ax, ylabel in ((ax_t, "median time per call (ms)"), (ax_m, "peak memory of a call (MiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("objects per image")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(path: str, args: dict, results) -> None:
    with open(path, "w") as f:
        json.dump(dict(environment=environment(), args=args, results=results), f, indent=1)
