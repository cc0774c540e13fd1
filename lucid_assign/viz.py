"""``lucid-assign viz``: draw which anchors each object of one image received as positives.

Ground-truth boxes (rotated or not) are drawn in one colour per object, the positive anchors of each object as dots
in its colour, and objects left with no positive in red dashes; a summary gives positives per object, the share of
objects with none, and the positives per pyramid level. Input: the built-in synthetic scene, or a YOLO label file
(``cls cx cy w h`` or ``cls x1 y1 x2 y2 x3 y3 x4 y4``, normalised) with an image size; predictions for a label file
are simulated around its objects the way the synthetic scenes do (a model mid-training). ``--compare`` draws a second
panel with other settings (for example ``--compare floor=0`` to see the stride floor's effect). Needs matplotlib.
"""

from __future__ import annotations

import argparse
import math
import os

import torch

from . import api
from .reference import INPUTS
from .synthetic import _predictions, anchor_points, corners, dota_like_batch

STRIDES = (8, 16, 32)
SETTINGS = {"topk": int, "topk2": int, "alpha": float, "beta": float, "floor": float}  # what --compare may change


class UsageError(ValueError):
    """A command-line argument of ``lucid-assign viz`` that cannot be used (the command says it in one line)."""


def read_labels(path: str, img_size: int):
    """(M, 5) boxes cx cy w h angle in pixels, (M,) labels, and whether the file is oriented."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) not in (5, 9):
                raise ValueError(f"{path}:{n}: expected 'cls cx cy w h' or 'cls x1 y1 ... x4 y4', got {len(parts)} "
                                 "values")
            rows.append([float(v) for v in parts])
    kinds = {len(r) for r in rows}
    if len(kinds) > 1:
        raise ValueError(f"{path}: mixes axis-aligned (5 values) and oriented (9 values) lines")
    if not rows:
        return torch.zeros(0, 5, dtype=torch.float64), torch.zeros(0, dtype=torch.long), False
    t = torch.tensor(rows, dtype=torch.float64)
    labels = t[:, 0].long()
    if t.shape[1] == 5:
        xywh = t[:, 1:] * img_size
        return torch.cat((xywh, torch.zeros(len(t), 1, dtype=torch.float64)), -1), labels, False
    pts = t[:, 1:].reshape(-1, 4, 2) * img_size
    centre = pts.mean(1)
    e1, e2 = pts[:, 1] - pts[:, 0], pts[:, 2] - pts[:, 1]
    w, h = e1.norm(dim=-1), e2.norm(dim=-1)
    angle = torch.atan2(e1[:, 1], e1[:, 0])
    angle = (angle + math.pi / 2) % math.pi - math.pi / 2  # [-pi/2, pi/2)
    return torch.cat((centre, w[:, None], h[:, None], angle[:, None]), -1), labels, True


def batch_from_labels(boxes, labels, img_size: int, num_classes: int, obb: bool, seed: int = 0) -> dict:
    """A one-image assignment problem from label boxes (cx cy w h angle, pixels) with simulated predictions."""
    if len(labels) and int(labels.max()) >= num_classes:
        raise ValueError(f"label {int(labels.max())} in the file is outside --classes {num_classes}")
    g = torch.Generator().manual_seed(seed)
    anc = anchor_points(img_size, STRIDES, dtype=torch.float64)
    strides_of = torch.cat([torch.full(((img_size // s) ** 2,), float(s), dtype=torch.float64) for s in STRIDES])
    pd, scores = _predictions(g, anc, boxes, labels, strides_of, num_classes, obb)
    gt = boxes
    if not obb:
        gt = torch.cat((boxes[:, :2] - boxes[:, 2:4] / 2, boxes[:, :2] + boxes[:, 2:4] / 2), -1)
        pd = torch.cat((pd[:, :2] - pd[:, 2:4] / 2, pd[:, :2] + pd[:, 2:4] / 2), -1)
    m = len(labels)
    return dict(pd_scores=scores[None].float(), pd_bboxes=pd[None].float(), anc_points=anc.float(),
                gt_labels=labels.float().reshape(1, m, 1), gt_bboxes=gt[None].float(), mask_gt=torch.ones(1, m, 1),
                stride=list(STRIDES), num_objects=[m])


def summarise(out, batch, image: int, img_size: int) -> dict:
    fg, idx = out[3][image], out[4][image]
    n = int(batch["mask_gt"][image, :, 0].bool().sum())
    counts = torch.bincount(idx[fg], minlength=max(n, 1))[:n] if n else torch.zeros(0, dtype=torch.long)
    levels, start = {}, 0
    for s in STRIDES:
        k = (img_size // s) ** 2
        levels[f"P{s}"] = int(fg[start:start + k].sum())
        start += k
    return dict(objects=n, positives=int(fg.sum()), per_object=counts.tolist(),
                none=int((counts == 0).sum()) if n else 0, levels=levels)


def parse_settings(text: str, base: dict) -> dict:
    """'topk=13,floor=0' applied over base settings; ValueError naming the setting when one cannot be used."""
    out = dict(base)
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = item.partition("=")
        if key not in SETTINGS:
            raise ValueError(f"--compare: unknown setting {key!r}; choose from {', '.join(SETTINGS)}")
        if not eq:
            raise ValueError(f"--compare: {item!r} needs a value, as in {key}=...")
        if value in ("", "none", "None"):
            out[key] = None
            continue
        try:
            out[key] = SETTINGS[key](value)
        except ValueError:
            raise ValueError(f"--compare: {key} takes {'a whole number' if SETTINGS[key] is int else 'a number'}, "
                             f"got {value!r}") from None
        if not (math.isfinite(out[key]) and out[key] >= (0 if key == "floor" else 1 if key.startswith("topk")
                                                          else -math.inf)):
            raise ValueError(f"--compare: {key}={value} is out of range")
    return out


def _compare_arg(text: str) -> str:
    """--compare, checked as it is parsed."""
    try:
        parse_settings(text, dict.fromkeys(SETTINGS))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--compare: ")) from None
    return text


def _labels_arg(path: str) -> str:
    """--labels: a file that can be read."""
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: "
                                         f"{'not a file' if os.path.exists(path) else 'no such file'}")
    return path


def assign_with(batch: dict, settings: dict, num_classes: int):
    stride = list(STRIDES)
    if settings["floor"] is not None:
        # the side floor is stride[1]; a floor of 0 disables it (any positive value below every side)
        stride[1] = settings["floor"] if settings["floor"] > 0 else 1e-6
    return api.assign(*(batch[k] for k in INPUTS), topk=settings["topk"], topk2=settings["topk2"],
                      num_classes=num_classes, alpha=settings["alpha"], beta=settings["beta"], stride=stride)


def draw(ax, batch, out, image: int, img_size: int, title: str) -> dict:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Polygon

    info = summarise(out, batch, image, img_size)
    n = info["objects"]
    gt = batch["gt_bboxes"][image, :n].tolist()
    anc = batch["anc_points"]
    fg, idx = out[3][image], out[4][image]
    cmap = plt.get_cmap("tab20")
    ax.set_xlim(0, img_size)
    ax.set_ylim(img_size, 0)
    ax.set_aspect("equal")
    ax.set_facecolor("#f7f7f7")
    stride_of = torch.cat([torch.full(((img_size // s) ** 2,), float(s)) for s in STRIDES])
    for m, box in enumerate(gt):
        colour = cmap(m % 20)
        none = info["per_object"][m] == 0
        ax.add_patch(Polygon(corners(box), closed=True, fill=False, lw=2.2 if none else 1.0,
                             ec="red" if none else colour, ls="--" if none else "-"))
        sel = fg & (idx == m)
        if sel.any():
            pts = anc[sel]
            ax.scatter(pts[:, 0], pts[:, 1], s=(stride_of[sel] / 4) ** 2 / 2, color=colour, edgecolors="k",
                       linewidths=0.3, zorder=3)
    per = info["per_object"]
    mean = sum(per) / len(per) if per else 0.0
    text = (f"objects {n}, positives {info['positives']}\n"
            f"per object: mean {mean:.1f}, min {min(per) if per else 0}, max {max(per) if per else 0}\n"
            f"no positive: {info['none']} ({100.0 * info['none'] / max(n, 1):.1f}%)\n"
            + ", ".join(f"{k} {v}" for k, v in info["levels"].items()))
    ax.text(0.01, 0.99, text, transform=ax.transAxes, va="top", ha="left", fontsize=7,
            bbox=dict(boxstyle="round", fc="white", alpha=0.85))
    handles = [Line2D([], [], marker="o", ls="", color="gray",
                      label="positive anchor (object's colour; size = stride)"),
               Line2D([], [], color="gray", label="ground truth"),
               Line2D([], [], color="red", ls="--", lw=2, label="object with no positive")]
    ax.legend(handles=handles, loc="lower right", fontsize=7, framealpha=0.85)
    ax.set_title(title, fontsize=9)
    return info


def run(args) -> dict:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"lucid-assign viz needs matplotlib (pip install matplotlib): {exc}")
    if args.labels:
        try:
            boxes, labels, obb = read_labels(args.labels, args.img_size)
            batch = batch_from_labels(boxes, labels, args.img_size, args.classes, obb, args.seed)
        except (ValueError, OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"argument --labels: {exc}") from None
        source, image = args.labels, 0
    else:
        obb = not args.hbb
        batch = dota_like_batch(batch=max(args.image + 1, 1), img_size=args.img_size, num_classes=args.classes,
                                objects=tuple(args.objects), obb=obb, seed=args.seed)
        source, image = "synthetic scene", args.image
    base = dict(topk=args.topk, topk2=args.topk2, alpha=args.alpha, beta=args.beta, floor=args.floor)
    panels = [base] + ([parse_settings(args.compare, base)] if args.compare else [])
    width, height = args.size
    dpi = 100
    fig, axes = plt.subplots(1, len(panels), figsize=(width / dpi, height / dpi), dpi=dpi, squeeze=False)
    infos = []
    for ax, settings in zip(axes[0], panels):
        out = assign_with(batch, settings, args.classes)
        floor = settings["floor"] if settings["floor"] is not None else STRIDES[1]
        title = (f"{source} ({'OBB' if obb else 'HBB'}, {args.img_size} px) - topk {settings['topk']}"
                 f"{'' if not settings['topk2'] else '/' + str(settings['topk2'])}, alpha {settings['alpha']}, "
                 f"beta {settings['beta']}, floor {floor}")
        infos.append(draw(ax, batch, out, image, args.img_size, title))
    fig.subplots_adjust(left=0.02, right=0.98, top=0.94, bottom=0.03, wspace=0.05)
    fig.savefig(args.out, dpi=dpi)
    plt.close(fig)
    for settings, info in zip(panels, infos):
        print(f"{settings}: {info['objects']} objects, {info['positives']} positives, {info['none']} with none, "
              f"levels {info['levels']}")
    print(f"written {args.out} ({width}x{height} px)")
    return dict(panels=panels, infos=infos)


def add_parser(sub):
    p = sub.add_parser("viz", help="draw the positives of each object of one image (PNG)")
    p.add_argument("--labels", type=_labels_arg, default=None,
                   help="YOLO label file (cls cx cy w h, or cls x1 y1 ... x4 y4; normalised)")
    p.add_argument("--img-size", type=int, default=1024, help="image size in pixels (square)")
    p.add_argument("--hbb", action="store_true", help="synthetic scene with axis-aligned boxes")
    p.add_argument("--objects", type=int, nargs=2, default=(40, 80), metavar=("LOW", "HIGH"))
    p.add_argument("--image", type=int, default=0, help="which image of the synthetic batch")
    p.add_argument("--classes", type=int, default=15)
    p.add_argument("--topk", type=int, default=10)
    p.add_argument("--topk2", type=int, default=None)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=6.0)
    p.add_argument("--floor", type=float, default=None, help="side floor in pixels (default stride[1] = 16; 0 = off)")
    p.add_argument("--compare", type=_compare_arg, default=None, metavar="KEY=VAL,...",
                   help="a second panel with these settings changed, e.g. floor=0 or topk=13,alpha=1")
    p.add_argument("--size", type=int, nargs=2, default=(1600, 860), metavar=("W", "H"), help="PNG size in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="lucid-assign-viz.png")
    return p
