"""Synthetic, seeded assignment problems that look like a detector's batch in the middle of training.

``dota_like_batch`` builds an aerial scene: objects from a few pixels to several hundred, rotated or not, half of them
packed in clusters (parking lots, harbours: rows of similar objects sharing an angle and a class), the rest spread
uniformly; predicted boxes that mostly sit near the object each anchor looks at, with jitter, and class scores that
are low everywhere but higher for the right class near objects. Top-k, conflicts, the stride floor and the zero fill
of the top-k are all exercised.

``dense_batch`` builds a dense scene (xView, SKU-110K): thousands of small objects per image, spread uniformly.

``pose_batch`` builds a keypoint scene (people, COCO's 17 keypoints by default): the inputs of the pose assigner.

``seg_batch`` builds a segmentation scene (objects with masks, predicted mask coefficients and prototypes): the inputs
of the segmentation assigner.

``detr_costs`` builds the matching costs a DETR trainer hands its solver (queries against an image's objects): an
untrained model's, nearly tied, or a partly trained one's, with confident and duplicated queries.
"""

from __future__ import annotations

import math

import torch


def anchor_points(img_size: int, strides=(8, 16, 32), dtype=torch.float32, device="cpu") -> torch.Tensor:
    """(A, 2) anchor centres in pixels, level by level, row-major: ((col + 0.5) * s, (row + 0.5) * s)."""
    points = []
    for s in strides:
        n = img_size // s
        c = (torch.arange(n, dtype=torch.float64) + 0.5) * s
        yy, xx = torch.meshgrid(c, c, indexing="ij")
        points.append(torch.stack((xx, yy), -1).reshape(-1, 2))
    return torch.cat(points).to(device=device, dtype=dtype)


def _objects(g, n, img_size, num_classes, obb):
    """(n, 5) boxes cx cy w h angle and (n,) labels for one image."""
    rand = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    n_cluster = int(n * 0.5)
    boxes = torch.empty(n, 5, dtype=torch.float64)
    labels = torch.empty(n, dtype=torch.long)
    # clusters: rows of similar small objects with one angle and one class
    done = 0
    while done < n_cluster:
        size = min(n_cluster - done, int(8 + rand(1).item() * 40))
        centre = rand(2) * img_size * 0.8 + img_size * 0.1
        angle = (rand(1).item() - 0.5) * math.pi if obb else 0.0
        length = 10 + rand(1).item() * 30
        width = length * (0.35 + rand(1).item() * 0.3)
        cols = max(1, int(math.sqrt(size)))
        i = torch.arange(size, dtype=torch.float64)
        grid = torch.stack(((i % cols) * width * 1.3, (i // cols) * length * 1.2), -1)
        grid -= grid.mean(0)
        cos, sin = math.cos(angle), math.sin(angle)
        rot = torch.tensor([[cos, -sin], [sin, cos]], dtype=torch.float64)
        xy = centre + grid @ rot.T + (rand(size, 2) - 0.5) * 2
        wh = torch.stack((torch.full((size,), width), torch.full((size,), length)), -1) * (0.9 + 0.2 * rand(size, 2))
        boxes[done : done + size] = torch.cat((xy, wh, torch.full((size, 1), angle)), -1)
        labels[done : done + size] = int(rand(1).item() * num_classes)
        done += size
    # the rest: uniform placement, log-uniform sizes from 3 px to ~400 px, aspect up to 1:4
    rest = n - n_cluster
    side = torch.exp(math.log(3.0) + rand(rest) * math.log(400 / 3.0))
    aspect = 1 + rand(rest) * 3
    wh = torch.stack((side, side / aspect), -1)
    xy = rand(rest, 2) * img_size
    angle = (rand(rest, 1) - 0.5) * math.pi if obb else torch.zeros(rest, 1, dtype=torch.float64)
    boxes[n_cluster:] = torch.cat((xy, wh, angle), -1)
    labels[n_cluster:] = (rand(rest) * num_classes).long().clamp(max=num_classes - 1)
    boxes[:, :2] = boxes[:, :2].clamp(0, img_size)
    return boxes, labels


def _predictions(g, anc, boxes, labels, strides_of, num_classes, obb, draw_only: bool = False):
    """Predicted boxes (A, 5) and scores (A, C) for one image given its objects. ``draw_only``: only the draws from
    ``g`` that they take (the same, in the same order, so that what is drawn next is the same), and None."""
    rand = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    n_anchors = anc.shape[0]
    if draw_only:
        randn(n_anchors, 2), rand(n_anchors, 2), rand(n_anchors, 1) if obb else None, randn(n_anchors, num_classes)
        if boxes.shape[0]:
            randn(n_anchors, 2), randn(n_anchors, 2), randn(n_anchors, 1) if obb else None, randn(n_anchors)
        return None
    # default: a box around the anchor, a few strides wide
    size = strides_of[:, None] * torch.exp(1.0 + 0.6 * randn(n_anchors, 2))
    ctr = anc + (rand(n_anchors, 2) - 0.5) * strides_of[:, None]
    angle = (rand(n_anchors, 1) - 0.5) * math.pi if obb else torch.zeros(n_anchors, 1, dtype=torch.float64)
    pd = torch.cat((ctr, size, angle), -1)
    logits = -4.0 + randn(n_anchors, num_classes)
    if boxes.shape[0]:
        # anchors near an object predict a jittered copy of it, its class more confidently
        # in chunks of anchors: (A, n) distances at once would take GiB at thousands of objects
        nearest = torch.cat([torch.cdist(a, boxes[:, :2]).argmin(1) for a in anc.split(2048)])
        obj = boxes[nearest]
        reach = obj[:, 2:4].max(-1).values / 2 + strides_of
        near = (anc - obj[:, :2]).norm(dim=-1) < reach
        jitter = torch.cat(
            (
                obj[:, :2] + randn(n_anchors, 2) * 0.15 * obj[:, 2:4],
                obj[:, 2:4] * torch.exp(0.25 * randn(n_anchors, 2)),
                obj[:, 4:] + 0.15 * randn(n_anchors, 1) if obb else obj[:, 4:],
            ),
            -1,
        )
        pd = torch.where(near[:, None], jitter, pd)
        boost = torch.zeros_like(logits)
        boost[torch.arange(n_anchors), labels[nearest]] = 4.0 + 1.5 * randn(n_anchors)
        logits = logits + boost * near[:, None]
    return pd, torch.sigmoid(logits)


def _dense_objects(g, n, img_size, num_classes, obb, sizes):
    """(n, 5) boxes and (n,) labels for one image of a dense scene: centres uniform over the image, sides
    log-uniform in ``sizes`` (pixels), aspect up to 1:3, any angle when ``obb``."""
    rand = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    lo, hi = sizes
    side = torch.exp(math.log(lo) + rand(n) * math.log(hi / lo))
    aspect = 1 + rand(n) * 2
    wh = torch.stack((side, (side / aspect).clamp(min=lo)), -1)
    xy = rand(n, 2) * img_size
    angle = (rand(n, 1) - 0.5) * math.pi if obb else torch.zeros(n, 1, dtype=torch.float64)
    labels = (rand(n) * num_classes).long().clamp(max=num_classes - 1)
    return torch.cat((xy, wh, angle), -1), labels


def dota_like_batch(
    batch: int = 4,
    img_size: int = 1024,
    num_classes: int = 15,
    objects=(20, 300),
    obb: bool = True,
    seed: int = 0,
    strides=(8, 16, 32),
    score_dtype=torch.float32,
    device="cpu",
    dense_sizes=None,
    counts=None,
    predictions: bool = True,
) -> dict:
    """A seeded batch: the six inputs of the assigner (keys as in ``assign``) plus ``stride`` and ``num_objects``.

    ``objects`` is an int (every image has that many) or a (low, high) range drawn per image; ``counts``, a list of
    ``batch`` numbers, gives each image's count instead. Padding rows are
    zeros with ``mask_gt`` 0. Boxes are ``cx cy w h angle`` when ``obb`` else ``x1 y1 x2 y2``. With ``dense_sizes``
    (low, high) in pixels the scene is a dense one instead (see ``dense_batch``). ``predictions=False``: the same
    objects, without the predictions (``pd_scores`` and ``pd_bboxes`` None), which take most of the time.
    """
    g = torch.Generator().manual_seed(seed)
    if counts is None:
        lo, hi = (objects, objects) if isinstance(objects, int) else objects
        counts = [lo + int(torch.randint(0, hi - lo + 1, (1,), generator=g)) for _ in range(batch)]
    elif len(counts) != batch:
        raise ValueError(f"counts: one number per image, got {len(counts)} for a batch of {batch}")
    counts = [int(n) for n in counts]
    n_max = max(counts) if counts else 0
    anc = anchor_points(img_size, strides, dtype=torch.float64)
    strides_of = torch.cat([torch.full(((img_size // s) ** 2,), float(s), dtype=torch.float64) for s in strides])
    box_dim = 5 if obb else 4
    gt = torch.zeros(batch, n_max, box_dim, dtype=torch.float64)
    labels = torch.zeros(batch, n_max, 1)
    mask = torch.zeros(batch, n_max, 1)
    if predictions:
        pd = torch.zeros(batch, anc.shape[0], box_dim, dtype=torch.float64)
        scores = torch.zeros(batch, anc.shape[0], num_classes, dtype=torch.float64)
    for b, n in enumerate(counts):
        if dense_sizes is None:
            boxes, cls = _objects(g, n, img_size, num_classes, obb)
        else:
            boxes, cls = _dense_objects(g, n, img_size, num_classes, obb, dense_sizes)
        made = _predictions(g, anc, boxes, cls, strides_of, num_classes, obb, draw_only=not predictions)
        if not obb:
            boxes = torch.cat((boxes[:, :2] - boxes[:, 2:4] / 2, boxes[:, :2] + boxes[:, 2:4] / 2), -1)
        gt[b, :n] = boxes
        labels[b, :n, 0] = cls.float()
        mask[b, :n] = 1.0
        if made is not None:
            pred, scores[b] = made
            pd[b] = pred if obb else torch.cat((pred[:, :2] - pred[:, 2:4] / 2, pred[:, :2] + pred[:, 2:4] / 2), -1)
    return dict(
        pd_scores=scores.to(device=device, dtype=score_dtype) if predictions else None,
        pd_bboxes=pd.to(device=device, dtype=torch.float32) if predictions else None,
        anc_points=anc.to(device=device, dtype=torch.float32),
        gt_labels=labels.to(device),
        gt_bboxes=gt.to(device=device, dtype=torch.float32),
        mask_gt=mask.to(device),
        stride=list(strides),
        num_objects=counts,
    )


def dense_batch(batch: int = 128, img_size: int = 640, num_classes: int = 60, objects=(2500, 5000), obb: bool = False,
                seed: int = 0, sizes=(4.0, 60.0), **kw) -> dict:
    """A dense scene, as in xView (satellite images, up to ~5,000 objects each) or SKU-110K (packed shelves): many small
    objects per image, sides ``sizes`` pixels (log-uniform), centres uniform over the image, so that neighbours'
    candidate regions overlap and many anchors are claimed by several objects. The default is xView-like: batch 128
    at 640 px, 60 classes, 2,500 to 5,000 axis-aligned objects per image. Predictions and scores as in
    ``dota_like_batch``; other keywords go to it."""
    return dota_like_batch(batch=batch, img_size=img_size, num_classes=num_classes, objects=objects, obb=obb,
                           seed=seed, dense_sizes=sizes, **kw)


# COCO's per-keypoint OKS sigmas (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles), from the COCO
# keypoint evaluation.
COCO_SIGMAS = (0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072, 0.062, 0.062, 0.107, 0.107, 0.087,
               0.087, 0.089, 0.089)


def _frame(seed, batch, objects, img_size, strides):
    """What pose_batch and seg_batch start from: the seeded generator with its float64 draws, the object count of each
    image (``objects``: a count, or a (low, high) range drawn per image), the anchors and each anchor's stride."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    lo, hi = (objects, objects) if isinstance(objects, int) else objects
    counts = [lo + int(torch.randint(0, hi - lo + 1, (1,), generator=g)) for _ in range(batch)]
    anc = anchor_points(img_size, strides, dtype=torch.float64)
    strides_of = torch.cat([torch.full(((img_size // s) ** 2,), float(s), dtype=torch.float64) for s in strides])
    return g, rand, randn, counts, anc, strides_of


def pose_batch(batch: int = 16, img_size: int = 640, num_classes: int = 1, objects=(20, 20), keypoints: int = 17,
               seed: int = 0, score_dtype=torch.float32, device="cpu", strides=(8, 16, 32)) -> dict:
    """A seeded keypoint batch: the inputs of the pose assigner (``assign_pose``) plus ``stride`` and
    ``num_objects``.

    Objects are axis-aligned boxes ``x1 y1 x2 y2``, upright (height 1.2-3x the width), heights log-uniform from 6 px to
    most of the image so that every pyramid level and the gate's edges (2 and 12 strides) are reached, and one object
    in ten a thin tall box (6-20 px wide) that the level gate may leave without candidates. Each has ``keypoints``
    points inside its box; a keypoint is visible (flag 2) with probability 0.7, otherwise it is at (0, 0) with flag 0,
    and one object in ten has none visible. Anchors near an object predict its box and keypoints with jitter
    (keypoints ``pd_kpts`` (B, A, K, 2) in pixels); the others predict points around themselves. ``sigmas`` are
    COCO's for 17 keypoints, else 1/K each (as the peer trainer's pose loss)."""
    g, rand, randn, counts, anc, strides_of = _frame(seed, batch, objects, img_size, strides)
    n_max, n_anchors = max(counts, default=0), anc.shape[0]
    gt = torch.zeros(batch, n_max, 4, dtype=torch.float64)
    gt_kpts = torch.zeros(batch, n_max, keypoints, 3, dtype=torch.float64)
    labels = torch.zeros(batch, n_max, 1)
    mask = torch.zeros(batch, n_max, 1)
    pd = torch.zeros(batch, n_anchors, 4, dtype=torch.float64)
    pd_kpts = torch.zeros(batch, n_anchors, keypoints, 2, dtype=torch.float64)
    scores = torch.zeros(batch, n_anchors, num_classes, dtype=torch.float64)
    for b, n in enumerate(counts):
        h = torch.exp(math.log(6.0) + rand(n) * math.log(img_size * 0.9 / 6.0))
        w = h / (1.2 + rand(n) * 1.8)
        thin = rand(n) < 0.1  # 6-20 px wide and tall: often too large for the finest level, too thin for the others
        w = torch.where(thin, 6.0 + rand(n) * 14.0, w)
        h = torch.where(thin, torch.maximum(h, 150.0 + rand(n) * img_size * 0.6), h)
        xy = rand(n, 2) * img_size
        boxes = torch.cat((xy, torch.stack((w, h), -1), torch.zeros(n, 1, dtype=torch.float64)), -1)
        cls = (rand(n) * num_classes).long().clamp(max=num_classes - 1)
        pred, sc = _predictions(g, anc, boxes, cls, strides_of, num_classes, obb=False)
        x1y1, x2y2 = boxes[:, :2] - boxes[:, 2:4] / 2, boxes[:, :2] + boxes[:, 2:4] / 2
        kxy = x1y1[:, None] + rand(n, keypoints, 2) * boxes[:, None, 2:4]
        vis = (rand(n, keypoints) < 0.7) & (rand(n, 1) >= 0.1)
        kxy = kxy * vis[..., None]
        gt[b, :n] = torch.cat((x1y1, x2y2), -1)
        gt_kpts[b, :n] = torch.cat((kxy, vis[..., None].double() * 2), -1)
        labels[b, :n, 0] = cls.float()
        mask[b, :n] = 1.0
        pd[b] = torch.cat((pred[:, :2] - pred[:, 2:4] / 2, pred[:, :2] + pred[:, 2:4] / 2), -1)
        scores[b] = sc
        # keypoints: near an object, its keypoints with jitter of a tenth of its size; elsewhere around the anchor
        around = anc[:, None] + randn(n_anchors, keypoints, 2) * strides_of[:, None, None] * 2
        if n:
            nearest = torch.cat([torch.cdist(a, xy).argmin(1) for a in anc.split(2048)])
            reach = boxes[nearest, 2:4].max(-1).values / 2 + strides_of
            near = (anc - xy[nearest]).norm(dim=-1) < reach
            size = boxes[nearest, 2:4].max(-1).values
            jitter = x1y1[nearest, None] + rand(n_anchors, keypoints, 2) * boxes[nearest, None, 2:4]
            jitter = torch.where(vis[nearest][..., None], kxy[nearest], jitter)
            jitter = jitter + randn(n_anchors, keypoints, 2) * size[:, None, None] * 0.1
            around = torch.where(near[:, None, None], jitter, around)
        pd_kpts[b] = around
    sigmas = torch.tensor(COCO_SIGMAS) if keypoints == 17 else torch.full((keypoints,), 1.0 / max(keypoints, 1))
    return dict(
        pd_scores=scores.to(device=device, dtype=score_dtype),
        pd_bboxes=pd.to(device=device, dtype=torch.float32),
        anc_points=anc.to(device=device, dtype=torch.float32),
        gt_labels=labels.to(device),
        gt_bboxes=gt.to(device=device, dtype=torch.float32),
        mask_gt=mask.to(device),
        anc_strides=strides_of.to(device=device, dtype=torch.float32),
        pd_kpts=pd_kpts.to(device=device, dtype=torch.float32),
        gt_kpts=gt_kpts.to(device=device, dtype=torch.float32),
        sigmas=sigmas.to(device=device, dtype=torch.float32),
        stride=list(strides),
        num_objects=counts,
    )


def seg_batch(batch: int = 16, img_size: int = 640, num_classes: int = 80, objects=(20, 20), mask_dim: int = 32,
              mask_ratio: int = 4, seed: int = 0, score_dtype=torch.float32, mask_dtype=torch.float32, device="cpu",
              strides=(8, 16, 32)) -> dict:
    """A seeded segmentation batch: the inputs of the segmentation assigner (``assign_seg``) plus ``stride`` and
    ``num_objects``.

    Objects are those of ``dota_like_batch`` without angles (clusters of small objects and log-uniform sizes from
    3 px to ~400 px). Masks are at ``img_size // mask_ratio`` pixels (the prototypes' resolution): an ellipse
    inscribed in the box, except one object in ten with an empty mask and one in ten filling its whole box (touching
    the crop border); clusters overlap. Prototypes are smooth random fields; anchors near an object predict
    coefficients that roughly paint the object's ellipse onto them (with noise), the others random ones, and one
    anchor in fifty all-zero coefficients (an empty predicted mask)."""
    g, rand, randn, counts, anc, strides_of = _frame(seed, batch, objects, img_size, strides)
    n_max, n_anchors = max(counts, default=0), anc.shape[0]
    mh = mw = img_size // mask_ratio
    gt = torch.zeros(batch, n_max, 4, dtype=torch.float64)
    labels = torch.zeros(batch, n_max, 1)
    mask = torch.zeros(batch, n_max, 1)
    gt_masks = torch.zeros(batch, n_max, mh, mw, dtype=torch.bool)
    pd = torch.zeros(batch, n_anchors, 4, dtype=torch.float64)
    scores = torch.zeros(batch, n_anchors, num_classes, dtype=torch.float64)
    # prototypes: random fields smoothed by average pooling (structure at a few mask pixels)
    proto = torch.nn.functional.avg_pool2d(randn(batch, mask_dim, mh, mw), 5, stride=1, padding=2) * 3
    coef = randn(batch, n_anchors, mask_dim)
    ys = (torch.arange(mh, dtype=torch.float64) + 0.5) * mask_ratio
    xs = (torch.arange(mw, dtype=torch.float64) + 0.5) * mask_ratio
    for b, n in enumerate(counts):
        boxes, cls = _objects(g, n, img_size, num_classes, obb=False)
        pred, sc = _predictions(g, anc, boxes, cls, strides_of, num_classes, obb=False)
        x1y1, x2y2 = boxes[:, :2] - boxes[:, 2:4] / 2, boxes[:, :2] + boxes[:, 2:4] / 2
        gt[b, :n] = torch.cat((x1y1, x2y2), -1)
        labels[b, :n, 0] = cls.float()
        mask[b, :n] = 1.0
        pd[b] = torch.cat((pred[:, :2] - pred[:, 2:4] / 2, pred[:, :2] + pred[:, 2:4] / 2), -1)
        scores[b] = sc
        kind = rand(n)
        for i in range(n):
            dx = (xs[None, :] - boxes[i, 0]) / (boxes[i, 2] / 2)
            dy = (ys[:, None] - boxes[i, 1]) / (boxes[i, 3] / 2)
            if kind[i] < 0.1:
                continue  # an empty mask
            shape = (dx.abs() <= 1) & (dy.abs() <= 1) if kind[i] < 0.2 else dx * dx + dy * dy <= 1
            gt_masks[b, i] = shape
        if n:
            # anchors near an object: the least-squares coefficients of its mask (+-1) on the prototypes, with noise
            nearest = torch.cat([torch.cdist(a, boxes[:, :2]).argmin(1) for a in anc.split(2048)])
            reach = boxes[nearest, 2:4].max(-1).values / 2 + strides_of
            near = (anc - boxes[nearest, :2]).norm(dim=-1) < reach
            basis = proto[b].flatten(1).T  # (pixels, mask_dim)
            target = gt_masks[b, :n].flatten(1).double().T * 2 - 1  # (pixels, n)
            fit = torch.linalg.lstsq(basis, target).solution.T  # (n, mask_dim)
            fitted = fit[nearest] * (1 + 0.3 * randn(n_anchors, 1)) + 0.05 * randn(n_anchors, mask_dim)
            coef[b] = torch.where(near[:, None], fitted, coef[b])
        coef[b, rand(n_anchors) < 0.02] = 0.0
    return dict(
        pd_scores=scores.to(device=device, dtype=score_dtype),
        pd_bboxes=pd.to(device=device, dtype=torch.float32),
        anc_points=anc.to(device=device, dtype=torch.float32),
        gt_labels=labels.to(device),
        gt_bboxes=gt.to(device=device, dtype=torch.float32),
        mask_gt=mask.to(device),
        pd_coef=coef.to(device=device, dtype=mask_dtype),
        mask_scale=torch.full((batch, 1), mh / img_size, dtype=torch.float32, device=device),
        proto=proto.to(device=device, dtype=mask_dtype),
        gt_masks=gt_masks.to(device),
        stride=list(strides),
        num_objects=counts,
    )


def check_batch(obb: bool) -> dict:
    """A small batch (2 images at 128 px, 336 anchors, 5 classes) that reaches every rare rule of the contract:
    conflicts, conflicts won by an object that did not claim the anchor, objects under the stride floor, padding
    rows, exact zero scores, and an object whose predictions all miss, so that its top-k is filled with the
    lowest-indexed anchors of metric 0. Cheap enough to run at every ``patch()``."""
    batch = dota_like_batch(batch=2, img_size=128, num_classes=5, objects=(20, 40), obb=obb, seed=8)
    gt, pd, anc = batch["gt_bboxes"], batch["pd_bboxes"], batch["anc_points"]
    corner = [14.0, 14.0, 24.0, 20.0, 0.3] if obb else [2.0, 3.0, 26.0, 22.0]
    gt[0, 0] = torch.tensor(corner)
    near = (anc[:, 0] < 40) & (anc[:, 1] < 40)
    shift = torch.tensor([64.0, 64.0, 0.0, 0.0, 0.0] if obb else [64.0] * 4)
    pd[0, near] += shift  # the predictions near the corner object look elsewhere: overlap 0 there
    g = torch.Generator().manual_seed(8)
    scores = batch["pd_scores"]
    scores[torch.rand(scores.shape, generator=g) < 0.05] = 0.0
    return batch


def corners(box) -> list:
    """Polygon of a box: x1 y1 x2 y2 or cx cy w h angle."""
    if len(box) == 4:
        x1, y1, x2, y2 = box
        return [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]
    cx, cy, w, h, a = box
    c, s = math.cos(a), math.sin(a)
    u, v = (w / 2 * c, w / 2 * s), (-h / 2 * s, h / 2 * c)
    return [(cx + u[0] + v[0], cy + u[1] + v[1]), (cx + u[0] - v[0], cy + u[1] - v[1]),
            (cx - u[0] - v[0], cy - u[1] - v[1]), (cx - u[0] + v[0], cy - u[1] + v[1])]


def write_yolo_dataset(folder, images: int = 8, img_size: int = 64, num_classes: int = 3, objects=(2, 6),
                       obb: bool = True, seed: int = 0, image_ext: str = "png", counts=None,
                       val_images: int | None = None) -> str:
    """Write a synthetic dataset in the peer trainer's YOLO layout under ``folder`` and return its data YAML's path.

    ``images`` noise images of ``img_size`` pixels with DOTA-like objects (see dota_like_batch; corners clipped to
    the image), labels ``cls x1 y1 x2 y2 x3 y3 x4 y4`` (OBB) or ``cls cx cy w h`` (HBB), normalised (``image_ext``
    "png" or "jpg"). The validation split is the same images, or with ``val_images`` the first that many (a list in
    val.txt). ``counts`` (one number per image) sets each image's objects instead of ``objects``; the images are then
    drawn 16 at a time (chunk k from seed + k). Nothing is downloaded. Needs OpenCV (a dependency of the peer)."""
    import os

    import cv2

    folder = os.path.abspath(os.fspath(folder))
    for split in ("images", "labels"):
        os.makedirs(os.path.join(folder, split, "train"), exist_ok=True)
    if counts is None:
        chunks = [(0, dota_like_batch(batch=images, img_size=img_size, num_classes=num_classes, objects=objects,
                                      obb=obb, seed=seed, predictions=False))]
    else:
        if len(counts) != images:
            raise ValueError(f"counts: one number per image, got {len(counts)} for {images} images")
        chunks = ((start, dota_like_batch(batch=len(counts[start:start + 16]), img_size=img_size,
                                          num_classes=num_classes, obb=obb, seed=seed + start // 16,
                                          counts=counts[start:start + 16], predictions=False))
                  for start in range(0, images, 16))
    g = torch.Generator().manual_seed(seed)
    for start, batch in chunks:
        for b in range(len(batch["num_objects"])):
            i = start + b
            pixels = torch.randint(0, 256, (img_size, img_size, 3), generator=g, dtype=torch.uint8).numpy()
            cv2.imwrite(os.path.join(folder, "images", "train", f"{i:05d}.{image_ext}"), pixels)
            mask = batch["mask_gt"][b, :, 0].bool()
            boxes = batch["gt_bboxes"][b][mask].double()
            cls = batch["gt_labels"][b, :, 0][mask].long()
            if obb:
                coords = torch.tensor([[x for point in corners(box) for x in point] for box in boxes.tolist()],
                                      dtype=torch.float64).reshape(-1, 8)
            else:
                x1, y1, x2, y2 = boxes.clamp(0, img_size).unbind(-1)
                coords = torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), -1)
            coords = (coords / img_size).clamp(0, 1)
            lines = [" ".join([str(int(k))] + [f"{x:.6f}" for x in row])
                     for k, row in zip(cls.tolist(), coords.tolist())]
            with open(os.path.join(folder, "labels", "train", f"{i:05d}.txt"), "w") as f:
                f.write("\n".join(lines) + "\n")
    val = "images/train"
    if val_images is not None:
        if not 1 <= val_images <= images:
            raise ValueError(f"val_images: between 1 and images ({images}), got {val_images}")
        val = "val.txt"
        with open(os.path.join(folder, val), "w") as f:
            f.write("".join(f"./images/train/{i:05d}.{image_ext}\n" for i in range(val_images)))
    yaml = os.path.join(folder, "data.yaml")
    names = "\n".join(f"  {k}: class{k}" for k in range(num_classes))
    with open(yaml, "w") as f:
        f.write(f"path: {folder}\ntrain: images/train\nval: {val}\nnames:\n{names}\n")
    return yaml


DETR_COSTS = ("uniform", "untrained", "trained")


def _xyxy(cxcywh: torch.Tensor) -> torch.Tensor:
    c, half = cxcywh[..., :2], cxcywh[..., 2:] / 2
    return torch.cat([c - half, c + half], -1)


def _giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The generalised IoU of every box of a (..., Q, 4) against every box of b (..., N, 4), corners."""
    a, b = a[..., :, None, :], b[..., None, :, :]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    inter = ((torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(min=0)
             * (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(min=0))
    union = area_a + area_b - inter
    hull = ((torch.maximum(a[..., 2], b[..., 2]) - torch.minimum(a[..., 0], b[..., 0]))
            * (torch.maximum(a[..., 3], b[..., 3]) - torch.minimum(a[..., 1], b[..., 1])))
    return inter / union - (hull - union) / hull


def detr_costs(batch: int = 16, queries: int = 300, objects: int = 10, kind: str = "untrained", seed: int = 0,
               num_classes: int = 80, gains=(2.0, 5.0, 2.0), duplicated: float = 0.2) -> torch.Tensor:
    """The (batch, queries, objects) float32 costs a DETR trainer's matcher gives its solver, one problem per image:
    RT-DETR's cost (focal class term at alpha 0.25, gamma 2; L1 of normalised cxcywh boxes; minus the GIoU; weighted
    by ``gains``) of synthetic predictions against synthetic objects (centres uniform, sides log-uniform from 2% to
    40% of the image, classes uniform).

    kind "uniform": uniform random costs in [0, 1) (the solver's easy case, for comparison). "untrained": every query
    predicts about the same box (the image's centre, sides 10%, jittered by 2%) with scores near the class prior
    (0.01): per object, the queries' costs differ in their last digits (near ties, a long search). "trained": a model
    part way: each object has one to three confident queries (its box within a few percent, its class's logit +2 to
    +5), a ``duplicated`` share of the queries repeats another query's prediction exactly (tied rows), and the rest
    predict scattered boxes with scores around the prior."""
    if kind not in DETR_COSTS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(DETR_COSTS)}")
    if min(batch, queries, objects) < 0 or not 0 <= duplicated <= 1:
        raise ValueError(f"batch, queries, objects must be >= 0 and duplicated in [0, 1]: got {batch}, {queries}, "
                         f"{objects}, {duplicated}")
    g = torch.Generator().manual_seed(seed)
    shape = (batch, queries, objects)
    if kind == "uniform":
        return torch.rand(shape, generator=g)
    sides = torch.exp(torch.empty(batch, objects, 2).uniform_(math.log(0.02), math.log(0.4), generator=g))
    centres = 0.05 + 0.9 * torch.rand(batch, objects, 2, generator=g)
    truth = torch.cat([centres, sides], -1)
    classes = torch.randint(0, num_classes, (batch, objects), generator=g)
    prior = -math.log(99.0)  # sigmoid(prior) = 0.01
    if kind == "untrained":
        boxes = torch.tensor([0.5, 0.5, 0.1, 0.1]) + 0.02 * torch.randn(batch, queries, 4, generator=g)
        logits = prior + 0.05 * torch.randn(batch, queries, num_classes, generator=g)
    else:
        boxes = torch.cat([0.05 + 0.9 * torch.rand(batch, queries, 2, generator=g),
                           torch.exp(torch.empty(batch, queries, 2).uniform_(math.log(0.02), math.log(0.4),
                                                                             generator=g))], -1)
        logits = prior + 0.5 * torch.randn(batch, queries, num_classes, generator=g)
        for b in range(batch):
            order = torch.randperm(queries, generator=g).tolist()
            taken = 0
            for n in range(objects):
                for _ in range(int(torch.randint(1, 4, (), generator=g))):
                    if taken == queries:
                        break
                    q = order[taken]
                    taken += 1
                    boxes[b, q] = truth[b, n] * (1 + 0.03 * torch.randn(4, generator=g))
                    logits[b, q, classes[b, n]] += 2 + 3 * float(torch.rand((), generator=g))
            copies = int(duplicated * queries)
            if queries and copies:  # distinct rows overwritten (a repeated index would leave the winner undefined)
                src = torch.randint(0, queries, (copies,), generator=g)
                dst = torch.randperm(queries, generator=g)[:copies]
                boxes[b, dst], logits[b, dst] = boxes[b, src].clone(), logits[b, src].clone()
    boxes[..., 2:] = boxes[..., 2:].clamp(min=1e-3)
    p = logits.sigmoid().gather(2, classes[:, None, :].expand(batch, queries, objects))
    alpha, gamma = 0.25, 2.0
    cls = (alpha * (1 - p) ** gamma * -(p + 1e-8).log()) - ((1 - alpha) * p ** gamma * -(1 - p + 1e-8).log())
    l1 = torch.cdist(boxes, truth, p=1)
    giou = _giou(_xyxy(boxes), _xyxy(truth))
    return (gains[0] * cls + gains[1] * l1 - gains[2] * giou).float()

