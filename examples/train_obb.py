"""Train a small oriented-box detector with `torch.ops.lucid.assign` in a loop of your own: no trainer.

    python examples/train_obb.py                      # 150 steps on the GPU if one is present, else on the CPU
    python examples/train_obb.py --device cpu --steps 60

The pieces a custom loop needs, each a few lines:
  - data: synthetic images of 64 px with 1-6 filled rotated rectangles each, whose colour is the class; a loader
    gives what trainers load, flat targets (N, 7): image index, class, cx cy w h (0-1, of the image side), angle;
  - `lucid_assign.pad_targets`: from those rows to the op's padded inputs on the device, with no synchronisation;
  - a tiny anchor-free model: one map at stride 8, per cell the class logits and a box (offset, size, angle);
  - `torch.ops.lucid.assign`: which cell learns which object, and with what score;
  - the loss: binary cross-entropy against the assigned scores, and 1 - probiou on the assigned boxes.
It prints the loss every few steps; the loss falls. docs/usage.md ("Your own training loop") explains each step.
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lucid_assign
from lucid_assign.reference import probiou

IMG, STRIDE, CLASSES = 64, 8, 3
COLOURS = torch.tensor([[1.0, 0.2, 0.2], [0.2, 1.0, 0.2], [0.2, 0.4, 1.0]])
# the assignment's settings, as a YOLO OBB trainer sets them (topk2 = topk: no second top-k)
TOPK, ALPHA, BETA, EPS = 10, 0.5, 6.0, 1e-9


def synthetic_batch(batch: int, generator: torch.Generator):
    """Images (B, 3, 64, 64) and flat targets (N, 7), as a data loader collates them (normalised boxes)."""
    images = torch.rand(batch, 3, IMG, IMG, generator=generator) * 0.1
    ys, xs = torch.meshgrid(torch.arange(IMG) + 0.5, torch.arange(IMG) + 0.5, indexing="ij")
    rows = []
    for b in range(batch):
        for _ in range(int(torch.randint(1, 7, (1,), generator=generator))):
            cls = int(torch.randint(0, CLASSES, (1,), generator=generator))
            w, h = (torch.rand(2, generator=generator) * 16 + 8).tolist()
            cx, cy = (torch.rand(2, generator=generator) * (IMG - 16) + 8).tolist()
            angle = float(torch.rand(1, generator=generator)) * math.pi / 2
            # pixels inside the rotated rectangle: rotate into the box's frame
            dx, dy = xs - cx, ys - cy
            u = dx * math.cos(angle) + dy * math.sin(angle)
            v = -dx * math.sin(angle) + dy * math.cos(angle)
            inside = (u.abs() <= w / 2) & (v.abs() <= h / 2)
            images[b][:, inside] = COLOURS[cls][:, None]
            rows.append([b, cls, cx / IMG, cy / IMG, w / IMG, h / IMG, angle])
    return images, torch.tensor(rows, dtype=torch.float32).reshape(-1, 7)


class TinyOBBDetector(nn.Module):
    """Three stride-2 convolutions to an 8 x 8 map; per cell C class logits and 5 box values."""

    def __init__(self, classes: int = CLASSES, width: int = 32):
        super().__init__()

        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.SiLU())

        self.body = nn.Sequential(block(3, width, 2), block(width, width, 1), block(width, 2 * width, 2),
                                  block(2 * width, 2 * width, 1), block(2 * width, 2 * width, 2))
        self.head = nn.Conv2d(2 * width, classes + 5, 1)
        nn.init.constant_(self.head.bias[:classes], -4.0)  # a low starting score, as detectors initialise it

    def forward(self, images):
        out = self.head(self.body(images))  # (B, C + 5, H, W)
        return out.flatten(2).transpose(1, 2)  # (B, A, C + 5), anchors in row-major order


def anchor_points(side: int, stride: int, device):
    """The centres of the map's cells in pixels, (A, 2) as (x, y)."""
    centres = (torch.arange(side, device=device, dtype=torch.float32) + 0.5) * stride
    ys, xs = torch.meshgrid(centres, centres, indexing="ij")
    return torch.stack([xs.reshape(-1), ys.reshape(-1)], 1)


def decode(raw, anchors):
    """Each cell's box in pixels, (B, A, 5) as cx cy w h angle: an offset of up to 2 cells from the cell's centre, a
    size of 1/4 to 4 cells around 2 cells, and an angle in [0, pi/2)."""
    offset = raw[..., 0:2].tanh() * 2 * STRIDE
    size = torch.exp(raw[..., 2:4].clamp(-4, 4) * 0.5) * 2 * STRIDE
    angle = raw[..., 4:5].sigmoid() * (math.pi / 2)
    return torch.cat([anchors + offset, size, angle], -1)


def loss_fn(out, anchors, gt_labels, gt_bboxes, mask_gt):
    logits, boxes = out[..., :CLASSES], decode(out[..., CLASSES:], anchors)
    scores = logits.detach().sigmoid()
    # the whole assignment in one op: no (batch x objects x anchors) tensor, no host synchronisation
    _, target_bboxes, target_scores, fg, _ = torch.ops.lucid.assign(
        scores, boxes.detach(), anchors, gt_labels, gt_bboxes, mask_gt,
        TOPK, TOPK, CLASSES, ALPHA, BETA, EPS, float(STRIDE))
    norm = target_scores.sum().clamp(min=1)
    cls_loss = F.binary_cross_entropy_with_logits(logits, target_scores, reduction="sum") / norm
    weight = target_scores.sum(-1)[fg]
    box_loss = ((1 - probiou(target_bboxes[fg], boxes[fg])) * weight).sum() / norm
    return cls_loss + box_loss, (cls_loss.detach(), box_loss.detach(), fg.sum())


def train(steps: int = 150, batch: int = 16, device: str = "auto", lr: float = 0.01, seed: int = 0,
          log_every: int = 10, verbose: bool = True):
    """Train for ``steps`` steps; returns the loss of every step (floats, read once at the end)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(seed)
    model = TinyOBBDetector().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    anchors = anchor_points(IMG // STRIDE, STRIDE, device)
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        images, targets = synthetic_batch(batch, data)
        # what trainers load, normalised, to the units of the anchors (pixels) ...
        targets[:, 2:6] *= IMG
        # ... then padded per image on the device: (B, M, 1) labels, (B, M, 5) boxes, (B, M, 1) mask
        gt_labels, gt_bboxes, mask_gt = lucid_assign.pad_targets(targets, batch, device=device)
        loss, parts = loss_fn(model(images.to(device, non_blocking=True)), anchors, gt_labels, gt_bboxes, mask_gt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if verbose and (step % log_every == 0 or step == steps - 1):
            cls_loss, box_loss, n_fg = (float(p) for p in parts)  # reading them synchronises: for the log only
            print(f"step {step:4d}  loss {float(loss.detach()):.4f}  (classes {cls_loss:.4f}, boxes {box_loss:.4f}, "
                  f"{int(n_fg)} assigned cells)", flush=True)
    losses = torch.stack(losses).tolist()
    if verbose:
        first, last = sum(losses[:10]) / len(losses[:10]), sum(losses[-10:]) / len(losses[-10:])
        print(f"{steps} steps on {device} in {time.perf_counter() - start:.1f} s: mean loss of the first 10 steps "
              f"{first:.4f}, of the last 10 {last:.4f}")
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="auto", help="auto (the GPU if one is present), cpu or cuda")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train(args.steps, args.batch, args.device, seed=args.seed)


if __name__ == "__main__":
    main()
