"""Command line (``lucid-assign`` or ``python -m lucid_assign``).

    lucid-assign bench   time the assigners side by side on a built-in DOTA-like batch (the main job)
    lucid-assign demo    assign a built-in DOTA-like batch with each backend and report what the assigner did
    lucid-assign viz     draw which anchors each object of one image received (PNG)
    lucid-assign doctor  what is installed and built, what backend="auto" uses, and a self-check
    lucid-assign yolo    the peer trainer's command line (ultralytics' `yolo`), patched: the same arguments, e.g.
                         lucid-assign yolo obb train data=DOTAv1.yaml model=yolo26n-obb.yaml device=0,1
    lucid-assign run     any training command, every trainer and named matcher patched in each of its Python
                         processes, e.g. lucid-assign run --matcher models.matcher:HungarianMatcher -- python train.py
"""

import sys

from . import _launch

if _launch.launching():  # `python -m lucid_assign run -- COMMAND` (lucid_assign/_launch.py), before torch loads
    sys.exit(_launch.launch())

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from . import _library, api, dispatch, viz  # noqa: E402
from .bench import PRESETS as BENCH_PRESETS  # noqa: E402
from .reference import INPUTS  # noqa: E402
from .synthetic import dota_like_batch  # noqa: E402

BENCH_DEFAULT_BACKENDS = "reference,kernel,peer"  # --kind lsap: kernel, api, scipy and tla


def _device(text: str) -> str:
    """--device: auto, cpu, cuda or cuda:N, and a GPU there when one is asked for."""
    kind, _, index = text.partition(":")
    if text != "auto" and (kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit()))):
        raise argparse.ArgumentTypeError(f"invalid device {text!r}: choose cpu, cuda, cuda:N or auto")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: torch sees no CUDA GPU here (torch {torch.__version__}, "
                                             f"built with CUDA {torch.version.cuda}); use --device cpu")
        if index and int(index) >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: torch sees {torch.cuda.device_count()} GPU(s), cuda:0 to "
                                             f"cuda:{torch.cuda.device_count() - 1}")
    return text


def _at_least(minimum: int):
    """An argparse type: a whole number >= minimum."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= {minimum}")
        return value

    return whole


_positive, _count = _at_least(1), _at_least(0)


def version_line() -> str:
    """lucid-assign's version and what it runs with: torch, the compiled library, the peer trainer."""
    from .doctor import installed_version, peer_version

    library = "loaded" if _library.loaded() else "not loaded"
    return (f"lucid-assign {installed_version()} (torch {torch.__version__}, compiled library {library}, "
            f"ultralytics {peer_version() or 'not installed'})")


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, reps):
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def _describe(out, batch, strides, img_size):
    labels, boxes, scores, fg, idx = out
    mask = batch["mask_gt"][..., 0].bool()
    n_boxes = mask.shape[1]
    counts = torch.zeros_like(mask, dtype=torch.long)
    if n_boxes:
        counts.scatter_add_(1, idx * fg, fg.long())
    per_obj = counts[mask].tolist()
    print(f"  positives per object: mean {statistics.mean(per_obj):.2f}, median {statistics.median(per_obj):g}, "
          f"min {min(per_obj)}, max {max(per_obj)}")
    none = sum(1 for c in per_obj if c == 0)
    print(f"  objects left with no positive: {none} of {len(per_obj)} ({100.0 * none / len(per_obj):.1f}%)")
    start = 0
    parts = []
    for s in strides:
        n = (img_size // s) ** 2
        parts.append(f"P{s}: {int(fg[:, start:start + n].sum())}")
        start += n
    print(f"  foreground anchors: {int(fg.sum())} of {fg.numel()} ({', '.join(parts)})")
    print(f"  target score sum: {float(scores.sum()):.3f}")


def demo(args) -> int:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.device != "auto":
        devices = [args.device]
    lo, hi = args.objects
    print(f"lucid-assign demo: DOTA-like {'OBB' if not args.hbb else 'HBB'} batch of {args.batch} at "
          f"{args.img_size} px, {args.classes} classes, {lo}-{hi} objects per image, topk {args.topk}")
    print(f"torch {torch.__version__}; compiled library: "
          f"{'loaded' if _library.loaded() else 'not loaded (' + str(_library.LOAD_ERROR) + ')'}")
    host = dota_like_batch(batch=args.batch, img_size=args.img_size, num_classes=args.classes, objects=(lo, hi),
                           obb=not args.hbb, seed=args.seed)
    strides = host["stride"]
    print(f"anchors: {host['anc_points'].shape[0]}, objects per image: {host['num_objects']}")
    kw = dict(topk=args.topk, num_classes=args.classes, stride=strides)
    first = None
    for device in devices:
        batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
        inputs = [batch[k] for k in INPUTS]
        kernel = dispatch.unsupported("assign", inputs)
        results = {}
        print(f"\n[{device}]")
        for backend in ("reference", "kernel"):
            if backend == "kernel" and kernel is not None:
                print(f"  kernel: not available ({kernel})")
                continue
            out = api.assign(*inputs, backend=backend, **kw)
            med, best = _time(lambda: api.assign(*inputs, backend=backend, **kw), device, args.reps)
            results[backend] = (out, med)
            print(f"  {backend:<9} assign: median {med * 1e3:8.2f} ms, min {best * 1e3:8.2f} ms")
        out = results.get("kernel", results["reference"])[0]
        _describe(out, batch, strides, args.img_size)
        if "kernel" in results:
            ref_out, ref_med = results["reference"]
            same = all(torch.equal(out[i], ref_out[i]) for i in (0, 1, 3, 4))
            scale = ref_out[2].abs().clamp(min=torch.finfo(ref_out[2].dtype).tiny)
            rel = float(((out[2] - ref_out[2]).abs() / scale).max()) if out[2].numel() else 0.0
            print(f"  kernel vs reference: {ref_med / results['kernel'][1]:.1f}x faster; labels/boxes/fg/index "
                  f"identical: {same}; scores max relative difference {rel:.1e}")
        if first is None:
            first = out
        else:
            # CPU and GPU math libraries round some transcendental results differently (docs/spec.md, precision
            # contract), so scores may differ in the last bits and a near-tie may fall the other way.
            same = [torch.equal(out[i].cpu(), first[i].cpu()) for i in (0, 1, 3, 4)]
            a, b = out[2].cpu().double(), first[2].cpu().double()
            rel = float(((a - b).abs() / b.abs().clamp(min=1e-30)).max()) if b.numel() else 0.0
            moved = int((out[3].cpu() != first[3]).sum())
            print(f"  vs {devices[0]}: labels/boxes/fg/index identical: {all(same)} ({moved} fg anchors differ); "
                  f"scores max relative difference {rel:.1e}")
    return 0


def bench(args) -> int:
    from . import bench as B

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if args.kind == "lsap":
        return bench_lsap(args, device)
    preset = B.PRESETS.get(args.preset, {})
    if preset:  # a dense scene: its kind, batch, classes and range of objects, unless given
        args.kind = preset["kind"]
        args.batch = args.batch or preset["batch"]
        args.classes = args.classes or preset["classes"]
        args.objects = args.objects or [preset["objects"]]
    args.objects = args.objects or [50, 200]
    batch = args.batch or (16 if device == "cuda" else 4)
    reps = args.reps or (20 if device == "cuda" else 5)
    backends = args.backends
    kind = args.kind
    spec = dict(B.KINDS[kind], num_classes=B.num_classes_of(kind, args.classes))
    env = B.environment()
    dense = bool(preset)
    print(f"lucid-assign bench: {kind.upper()} at {spec['img_size']} px, {spec['num_classes']} classes, batch {batch}, "
          f"objects per image {', '.join(B.objects_label(o) for o in args.objects)}"
          f"{' (dense scene: ' + args.preset + ')' if dense else ''}, top-k {B.TOPK}, device {device}")
    print(f"torch {env['torch']} (CUDA {env['cuda']}), GPU {env['gpu']}, CPU threads {env['cpu_threads']}, "
          f"commit {env['commit']}, {env['date']}")
    results = B.run(kind, batch, args.objects, device, backends, reps, seed=args.seed, progress=not args.no_progress,
                    classes=args.classes, dense=dense)
    # what the assigner did on the last batch
    last = args.objects[-1]
    biggest = B.scene(kind, batch, last, device, args.seed, classes=args.classes, dense=dense)[0]
    done = [r["backend"] for r in results if r["objects"] == last and "median_s" in r]
    shown = "kernel" if "kernel" in done else (done[0] if done else None)
    if shown in ("kernel", "reference"):
        print(f"\nassignment at {B.objects_label(last)} objects per image ({shown}):")
        _describe(B.assign_runner(shown, kind, args.classes)(biggest), biggest, biggest["stride"], spec["img_size"])
    print()
    print(B.table(results))
    B.write_json(args.out, vars(args) | dict(device=device, batch=batch, reps=reps), results)
    print(f"\nresults and environment written to {args.out}")
    if args.plot:
        B.plot(results, args.plot, f"{kind.upper()} {spec['img_size']} px, batch {batch}, {device} "
               f"({env['gpu'] or env['cpu']}), {env['date']}")
        print(f"plot written to {args.plot}")
    return 0


def bench_lsap(args, device) -> int:
    """lucid-assign bench --kind lsap: the linear sum assignment against SciPy's path and torch-linear-assignment."""
    from . import bench as B

    shapes = args.shapes or list(B.LSAP_SHAPES)
    given = args.backends if args.backends != _backends(BENCH_DEFAULT_BACKENDS) else ["kernel", "api", "peer"]
    backends = [b for b in given if b != "peer"] + (["scipy", "tla"] if "peer" in given else [])
    reps = args.reps or (20 if device == "cuda" else 5)
    env = B.environment()
    print(f"lucid-assign bench: linear sum assignment of float32 costs ({', '.join(args.costs)}), shapes "
          f"{', '.join('x'.join(map(str, s)) for s in shapes)}, device {device}")
    print(f"torch {env['torch']} (CUDA {env['cuda']}), GPU {env['gpu']}, CPU threads {env['cpu_threads']}, "
          f"commit {env['commit']}, {env['date']}")
    results = B.lsap_run(shapes, device, list(dict.fromkeys(backends)), reps, seed=args.seed,
                         progress=not args.no_progress, costs=list(dict.fromkeys(args.costs)))
    print()
    print(B.lsap_table(results))
    B.write_json(args.out, vars(args) | dict(device=device, reps=reps), results)
    print(f"\nresults and environment written to {args.out}")
    return 0


def _shape(text: str) -> tuple:
    """--shapes: BxRxC, e.g. 16x300x50."""
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a shape is BxRxC with three positive numbers, e.g. 16x300x50")
    return shape


def _backends(text: str) -> list:
    """--backends: a comma-separated list of reference, kernel and peer."""
    backends = [b.strip() for b in text.split(",") if b.strip()]
    unknown = sorted(set(backends) - {"reference", "kernel", "peer", "scipy", "tla", "api"})
    if unknown or not backends:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown {unknown}; choose from reference, kernel, peer (and for "
                                         "--kind lsap scipy, tla, api)"
                                         if unknown else "name at least one of reference, kernel, peer")
    return backends


class UsageError(Exception):
    """A command-line mistake, or what the command needs and lacks: said in one line, exit status 2."""


def yolo(args) -> int:
    """Run the peer's own command line with its detection, OBB, pose and segmentation losses using lucid-assign's
    assigners (and every rank of a multi-GPU run it launches)."""
    from .integrations import ultralytics as integ

    # the peer reads its arguments from sys.argv (bound at its import): replace them in place, before importing it
    sys.argv[:] = ["yolo", *args.args]
    try:
        integ.patch(args.backend)
    except (ImportError, RuntimeError) as exc:  # no peer, a release it cannot patch, or no library for "kernel"
        raise UsageError(str(exc)) from exc
    from ultralytics.cfg import entrypoint

    entrypoint()
    return 0


def build_parser():
    """The parser of every command, and the subparsers by command name."""
    parser = argparse.ArgumentParser(prog="lucid-assign", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_line(),
                        help="show lucid-assign's version, torch's, the compiled library's state and the peer's")
    sub = parser.add_subparsers(dest="command", required=True)
    bp = sub.add_parser("bench", help="time the assigners side by side on a built-in DOTA-like batch")
    bp.add_argument("--kind", choices=("obb", "hbb", "pose", "seg", "lsap"), default="obb",
                    help="obb: 1024 px, 21,504 anchors, 15 classes; hbb: 640 px, 8,400 anchors, 80 classes; pose: "
                    "hbb with 17 keypoints per object (people), the pose assigner; seg: hbb with masks (32 prototypes "
                    "at 160 x 160), the segmentation assigner; lsap: the linear sum assignment (Hungarian matching) "
                    "of random costs, --shapes, against SciPy's path (scipy) and torch-linear-assignment (tla; "
                    "'peer' stands for both)")
    bp.add_argument("--shapes", type=_shape, nargs="+", default=None, metavar="BxRxC",
                    help="--kind lsap: cost shapes, batch x rows x columns (default 16x300x10 16x300x50 16x300x200, "
                    "RT-DETR's 300 queries against 10, 50 and 200 objects per image)")
    bp.add_argument("--costs", choices=("uniform", "untrained", "trained"), nargs="+", default=["uniform"],
                    help="--kind lsap: the costs, uniform random, or a DETR trainer's (lucid_assign.synthetic."
                    "detr_costs): an untrained model's (near ties), a partly trained one's (confident and duplicated "
                    "queries); default uniform")
    bp.add_argument("--batch", type=_positive, default=None,
                    help="images per batch (default 16 on a GPU, 4 on the CPU)")
    bp.add_argument("--objects", type=_count, nargs="+", default=None,
                    help="objects per image (one run each; default 50 200)")
    bp.add_argument("--preset", choices=sorted(BENCH_PRESETS), default=None,
                    help="a dense scene of many small objects: xview (HBB, batch 128 at 640 px, 60 classes, "
                    "2,500-5,000 objects per image) or dense-obb (OBB, batch 16 at 1024 px, 15 classes, the same "
                    "counts); --batch and --classes still apply")
    bp.add_argument("--classes", type=_positive, default=None,
                    help="number of classes (default 15 for obb, 80 for hbb, pose and seg)")
    bp.add_argument("--device", type=_device, default="auto",
                    help="cpu, cuda, cuda:N or auto (a GPU if torch sees one)")
    bp.add_argument("--backends", type=_backends, default=BENCH_DEFAULT_BACKENDS,
                    help="comma-separated: reference, kernel, peer (the peer needs ultralytics)")
    bp.add_argument("--reps", type=_positive, default=None,
                    help="timed calls per case, after warm-up calls (default 20 on a GPU, 5 on the CPU)")
    bp.add_argument("--seed", type=int, default=0)
    bp.add_argument("--out", default="lucid-assign-bench.json", help="JSON file for the results and environment")
    bp.add_argument("--plot", default=None, metavar="PNG", help="also plot time and memory against objects")
    bp.add_argument("--no-progress", action="store_true")
    d = sub.add_parser("demo", help="assign a built-in DOTA-like batch and report what happened")
    d.add_argument("--batch", type=_positive, default=4)
    d.add_argument("--img-size", type=_positive, default=1024)
    d.add_argument("--classes", type=_positive, default=15)
    d.add_argument("--objects", type=_count, nargs=2, default=(20, 300), metavar=("LOW", "HIGH"))
    d.add_argument("--topk", type=_positive, default=10)
    d.add_argument("--hbb", action="store_true", help="axis-aligned boxes instead of oriented ones")
    d.add_argument("--device", type=_device, default="auto",
                   help="cpu, cuda, cuda:N or auto (both when a GPU is present)")
    d.add_argument("--reps", type=_positive, default=3)
    d.add_argument("--seed", type=int, default=0)
    vp = viz.add_parser(sub)
    sub.add_parser("doctor", help="versions, build, backend choice, and a self-check of every backend")
    y = sub.add_parser("yolo", help="the peer's `yolo` command line with lucid-assign's assigners (same arguments)",
                       description="Runs `yolo ARGS` of the peer trainer (ultralytics) with its detection, OBB, "
                       "pose and segmentation losses patched to use lucid-assign's assigners, multi-GPU runs included. "
                       "Example: "
                       "lucid-assign yolo obb train data=DOTAv1.yaml model=yolo26n-obb.yaml device=0,1")
    y.add_argument("--backend", choices=dispatch.BACKENDS, default="auto",
                   help="lucid-assign's backend (default auto: the kernel where it can run, else the peer's own "
                   "assigner, with a warning that says why); LUCID_ASSIGN_BACKEND overrides it")
    y.add_argument("args", nargs=argparse.REMAINDER, help="the peer's arguments, exactly as for `yolo`")
    r = sub.add_parser("run", add_help=False, help="run a training command (python train.py, torchrun ..., yolo ...) "
                       "with each trainer and named DETR matcher patched in every Python process it starts "
                       "(`lucid-assign run --help`)")
    r.add_argument("args", nargs=argparse.REMAINDER)
    return parser, {"yolo": y, "viz": vp, "bench": bp, "demo": d, "run": r}


def parse(argv=None):
    """The command line's arguments, parsed (a mistake exits with status 2)."""
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["run"]:  # its own parser (lucid_assign/_launch.py), which the launch uses before torch loads
        try:
            backend, trainers, matchers, command = _launch.parse(given[1:])
        except _launch.UsageError as exc:
            build_parser()[1]["run"].error(str(exc))
        return argparse.Namespace(command="run", backend=backend, trainers=trainers, matchers=matchers, args=command)
    return build_parser()[0].parse_args(argv)


def main(argv=None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["run"]:  # COMMAND replaces this process (lucid_assign/_launch.py)
        return _launch.main(given[1:])
    parser, subparsers = build_parser()
    args = parser.parse_args(argv)
    commands = {"yolo": yolo, "viz": viz.run, "bench": bench, "demo": demo}
    if args.command == "doctor":
        from . import doctor

        return doctor.run(args)
    try:
        code = commands[args.command](args)
    except (UsageError, viz.UsageError) as exc:
        subparsers[args.command].error(str(exc))  # one line and exit status 2, as argparse does for its own checks
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
