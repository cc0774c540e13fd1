"""Random assignment problems for the tests: small images, so that the dense reference stays fast, shaped to hit the
rare paths (tiny boxes under the stride floor, clustered objects that conflict, padding rows, anchors on edges)."""

from __future__ import annotations

import math

import torch

from lucid_assign import reference
from lucid_assign.synthetic import anchor_points, pose_batch, seg_batch

STRIDES = (8, 16, 32)
STRIDE_VAL = reference.stride_value(STRIDES)  # the side floor: stride[1]
# the settings of the pose and segmentation tests: the peer's losses' (topk 10; YOLO26's one-to-one 7 with topk2 1)
# and one with a second top-k that keeps several
MODEL_SETTINGS = [dict(topk=10, topk2=None, alpha=0.5), dict(topk=7, topk2=1, alpha=0.5),
                  dict(topk=13, topk2=4, alpha=1.0)]
MODEL_SETTING_IDS = ["k10", "k7k2_1", "k13k2_4"]


def make_problem(
    seed: int,
    obb: bool,
    batch: int = 2,
    n_boxes: int = 12,
    img_size: int = 128,
    num_classes: int = 7,
    score_dtype=torch.float32,
    pad_rows: int = 3,
    tiny_frac: float = 0.3,
    edge_frac: float = 0.2,
    cluster: bool = True,
    int_labels: bool = False,
    corner_miss: bool = True,
):
    """Inputs (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt) on the CPU, float32 boxes."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    anc = anchor_points(img_size)
    n_anchors = anc.shape[0]
    real = n_boxes - pad_rows
    # centres: half clustered around a few spots (so objects overlap and anchors are claimed twice)
    spots = rand(batch, 3, 2) * img_size
    pick = (rand(batch, n_boxes) * 3).long().clamp(max=2)
    centres = torch.gather(spots, 1, pick[..., None].expand(-1, -1, 2)) + (rand(batch, n_boxes, 2) - 0.5) * 24
    if not cluster:
        centres = rand(batch, n_boxes, 2) * img_size
    size = torch.exp(rand(batch, n_boxes, 2) * math.log(60.0)) + 1.0  # 2 .. 61 px, log-uniform
    tiny = rand(batch, n_boxes, 1) < tiny_frac
    size = torch.where(tiny, rand(batch, n_boxes, 2) * 10 + 0.5, size)  # under the floor of 16
    angle = (rand(batch, n_boxes, 1) - 0.5) * math.pi
    if obb:
        gt = torch.cat((centres, size, angle), -1)
        # some axis-aligned boxes with corners exactly on anchor centres (closed test at the edge)
        on_edge = rand(batch, n_boxes) < edge_frac
        k = (rand(batch, n_boxes, 2) * (img_size // 8 - 4)).floor()
        corner = (k + 0.5) * 8
        span = ((rand(batch, n_boxes, 2) * 4).floor() + 2) * 8
        edge_box = torch.cat((corner + span / 2, span, torch.zeros(batch, n_boxes, 1, dtype=torch.float64)), -1)
        gt = torch.where(on_edge[..., None], edge_box, gt)
    else:
        gt = torch.cat((centres - size / 2, centres + size / 2), -1)
        on_edge = rand(batch, n_boxes) < edge_frac
        k = (rand(batch, n_boxes, 2) * (img_size // 8 - 4)).floor()
        corner = (k + 0.5) * 8
        span = ((rand(batch, n_boxes, 2) * 4).floor() + 1) * 8
        gt = torch.where(on_edge[..., None], torch.cat((corner, corner + span), -1), gt)
    if corner_miss and real > 1:
        # row 1 sits in the top-left corner where (below) the predictions miss: its align is 0 at most anchors,
        # so the top-k fills up with the lowest-indexed zero-metric anchors, some inside it (the zero fill)
        corner_box = [14.0, 14.0, 24.0, 20.0, 0.3] if obb else [2.0, 3.0, 26.0, 22.0]
        gt[:, 1] = torch.tensor(corner_box, dtype=torch.float64)
    mask = torch.zeros(batch, n_boxes, 1)
    mask[:, :real] = 1.0
    gt = torch.where(mask.bool(), gt, torch.zeros_like(gt))  # padding rows are zeros, as trainers pad them
    labels = (rand(batch, n_boxes, 1) * num_classes).floor().clamp(max=num_classes - 1)
    labels = labels * mask

    # predictions "mid-training": boxes around each anchor with a size spread, some near the objects
    stride_of = torch.cat([torch.full(((img_size // s) ** 2,), float(s)) for s in STRIDES]).double()
    pd_size = stride_of[None, :, None] * torch.exp((rand(batch, n_anchors, 2) - 0.3) * 2.5)
    pd_ctr = anc.double()[None] + (rand(batch, n_anchors, 2) - 0.5) * stride_of[None, :, None]
    if obb:
        pd_angle = (rand(batch, n_anchors, 1) - 0.5) * math.pi
        pd = torch.cat((pd_ctr, pd_size, pd_angle), -1)
    else:
        pd = torch.cat((pd_ctr - pd_size / 2, pd_ctr + pd_size / 2), -1)
    if corner_miss:
        near = (anc[:, 0] < 40) & (anc[:, 1] < 40)
        pd[:, near, :2] += img_size / 2  # far from the corner object: CIoU/probiou clamp to 0
        if not obb:
            pd[:, near, 2:] += img_size / 2
    scores = rand(batch, n_anchors, num_classes) ** 3  # mostly small, a few confident
    scores[rand(batch, n_anchors, num_classes) < 0.05] = 0.0  # exact zeros: ties in the top-k
    labels = labels.long() if int_labels else labels.float()
    return (
        scores.to(score_dtype),
        pd.float(),
        anc,
        labels,
        gt.float(),
        mask,
    )


def to(device, tensors):
    return tuple(t.to(device) for t in tensors)


def _task_problem(batch: dict, extra: tuple, narrow: tuple, trainer_dtypes: bool, device) -> list:
    """The ten inputs of a pose or segmentation batch; trainer_dtypes: ``narrow`` in bfloat16, as the peer trainer
    passes them under bf16 autocast."""
    if trainer_dtypes:
        for k in narrow:
            batch[k] = batch[k].to(torch.bfloat16)
    return [batch[k].to(device) for k in reference.INPUTS + extra]


def pose_problem(seed, batch=2, img_size=160, objects=(4, 20), keypoints=17, num_classes=3, trainer_dtypes=False,
                 device="cpu"):
    """The ten inputs of assign_pose (trainer_dtypes: scores, anchors, strides and predicted keypoints bfloat16)."""
    b = pose_batch(batch=batch, img_size=img_size, objects=objects, keypoints=keypoints, num_classes=num_classes,
                   seed=seed)
    return _task_problem(b, reference.POSE_INPUTS, ("pd_scores", "anc_points", "anc_strides", "pd_kpts"),
                         trainer_dtypes, device)


def seg_problem(seed, batch=2, img_size=160, objects=(4, 20), num_classes=3, mask_dim=8, trainer_dtypes=False,
                device="cpu"):
    """The ten inputs of assign_seg (trainer_dtypes: scores, anchors, mask coefficients and prototypes bfloat16)."""
    b = seg_batch(batch=batch, img_size=img_size, objects=objects, num_classes=num_classes, mask_dim=mask_dim,
                  seed=seed)
    return _task_problem(b, reference.SEG_INPUTS, ("pd_scores", "anc_points", "pd_coef", "proto"), trainer_dtypes,
                         device)
