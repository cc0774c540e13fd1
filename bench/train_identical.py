"""Training with and without lucid-assign is the same training: N steps of the peer trainer's yolo26n-obb (or
yolo26n-pose with --task pose, yolo26n-seg with --task seg, rtdetr-l with --task rtdetr), run three times from one
seed (unpatched twice, then patched), with the peer's deterministic settings
(``ultralytics.utils.torch_utils.init_seeds(0, deterministic=True)``, as its trainer sets them by default).

    python bench/train_identical.py                        # GPU: 50 steps, batch 16 at 1024 px, bf16 autocast
    python bench/train_identical.py --task pose            # yolo26n-pose: batch 16 at 640 px, 20 people per image
    python bench/train_identical.py --task seg             # yolo26n-seg: batch 16 at 640 px, 20 objects per image
    python bench/train_identical.py --task rtdetr          # rtdetr-l: batch 16 at 640 px, 20 objects per image
    python bench/train_identical.py --device cpu --imgsz 128 --batch 2 --objects 5 --steps 3   # smoke test

It prints, for the second unpatched run and for the patched run, how many of the loss values (every loss item of
every step), model tensors (parameters and buffers) and optimiser-state tensors differ from the first run, bit for
bit (NaN compared by its bits). Exit status 0 when the patched run matches and the two unpatched runs agree. Where
the unpatched runs differ from each other (RT-DETR on CUDA: grid_sample's backward is not deterministic), the matches
are compared call by call in one unpatched run instead (shadow_matches).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step as ts  # noqa: E402


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.uint8) if t.is_floating_point() else t


def flat(loss: torch.Tensor, items) -> torch.Tensor:
    """The loss and its items (a tensor or a dict of them) as one flat CPU tensor."""
    parts = list(items.values()) if isinstance(items, dict) else [items]
    return torch.cat([loss.flatten().cpu()] + [torch.as_tensor(t).detach().flatten().cpu() for t in parts])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def flat_state(state, prefix=""):
    """Every tensor of a (nested) state dict, by a dotted key."""
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            out[key] = v.detach().cpu()
        elif isinstance(v, dict):
            out.update(flat_state(v, key + "."))
    return out


def train(args, batches, patched: bool) -> dict:
    from ultralytics.utils.torch_utils import init_seeds

    from lucid_assign.integrations import ultralytics as integ

    init_seeds(0, deterministic=True)
    with (integ.patched(args.backend) if patched else contextlib.nullcontext(),
          warnings.catch_warnings(record=True) as caught):
        warnings.simplefilter("always")
        model, opt = ts.build(args.device, args.task, args.model)
        losses = [flat(*ts.step(model, opt, batches[i % len(batches)], args.device)) for i in range(args.steps)]
        kinds = sorted({type(getattr(p, "matcher", None) or p.assigner).__name__ for p in _parts(model)})
    notes = sorted({str(w.message).splitlines()[0][:160] for w in caught})
    return dict(losses=losses, model=flat_state(model.state_dict()), opt=flat_state(opt.state_dict()), kinds=kinds,
                warnings=notes)


def _parts(model):
    crit = model.criterion
    return [crit.one2many, crit.one2one] if hasattr(crit, "one2one") else [crit]


def shadow_matches(args, batches) -> tuple:
    """RT-DETR's training is not deterministic on CUDA (grid_sample's backward adds in any order), so two unpatched
    runs already differ after the first step. Its matches are then compared call by call instead: one unpatched run in
    which every call of the peer's matcher also runs lucid-assign's on the same inputs. Returns (identical calls,
    calls)."""
    from ultralytics.models.utils import ops as detr_ops
    from ultralytics.utils.torch_utils import init_seeds

    from lucid_assign.integrations import ultralytics_detr as detr

    peer_cls = detr_ops.HungarianMatcher
    variant, why = detr.check_matcher(peer_cls)
    if variant is None:
        raise SystemExit(f"the matcher cannot be patched here: {why}")
    stats = [0, 0]
    peer_forward = peer_cls.forward

    def both(self, *a, **kw):
        theirs = peer_forward(self, *a, **kw)
        ours = self.__dict__.get("_lucid_shadow")
        if ours is None:
            ours = self.__dict__["_lucid_shadow"] = detr.LucidHungarianMatcher(
                cost_gain=self.cost_gain, use_fl=self.use_fl, alpha=self.alpha, gamma=self.gamma)
        mine = ours(*a, **kw)
        stats[1] += 1
        stats[0] += len(mine) == len(theirs) and all(torch.equal(i.cpu(), k) and torch.equal(j.cpu(), m)
                                                     for (i, j), (k, m) in zip(mine, theirs))
        return theirs

    init_seeds(0, deterministic=True)
    detr.LucidHungarianMatcher.variant, peer_cls.forward = variant, both
    try:
        model, opt = ts.build(args.device, args.task, args.model)
        for i in range(args.steps):
            ts.step(model, opt, batches[i % len(batches)], args.device)
    finally:
        detr.LucidHungarianMatcher.variant, peer_cls.forward = None, peer_forward
    return stats[0], stats[1]


def compare(base: dict, other: dict) -> dict:
    loss_diff = [i for i, (a, b) in enumerate(zip(base["losses"], other["losses"])) if not same(a, b)]
    model_diff = [k for k in base["model"] if not same(base["model"][k], other["model"][k])]
    opt_diff = [k for k in base["opt"] if k not in other["opt"] or not same(base["opt"][k], other["opt"][k])]
    return dict(loss_steps=loss_diff, model=model_diff, opt=opt_diff, n_model=len(base["model"]),
                n_opt=len(base["opt"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--task", choices=("obb", "pose", "seg", "rtdetr"), default="obb")
    p.add_argument("--imgsz", type=int, default=None, help="default 1024 (obb), 640 (pose, seg, rtdetr)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--objects", type=int, default=None, help="default 60 (obb), 20 (pose, seg, rtdetr)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--backend", default="auto", help="backend of the patched run (auto, kernel, reference)")
    p.add_argument("--batches", type=int, default=5, help="distinct synthetic batches, used in turn")
    p.add_argument("--model", default=None, help="the model's YAML (default yolo26n-TASK.yaml; releases before 8.4: "
                   "e.g. yolov8n-obb.yaml)")
    args = p.parse_args(argv)
    args.imgsz = args.imgsz or (640 if args.task in ("pose", "seg", "rtdetr") else 1024)
    args.objects = args.objects or (20 if args.task in ("pose", "seg", "rtdetr") else 60)
    import ultralytics

    default_model = "rtdetr-l" if args.task == "rtdetr" else "yolo26n-" + args.task
    print(f"{args.model or default_model} (ultralytics {ultralytics.__version__}), {args.steps} steps, batch "
          f"{args.batch} at {args.imgsz} px, {args.objects} objects/image, bf16 autocast, {args.device}, torch "
          f"{torch.__version__}"
          f"{', ' + torch.cuda.get_device_name() if args.device == 'cuda' else ''}")
    batches = [ts.labels_batch(args.batch, args.imgsz, args.objects, 1000 + s, args.device, task=args.task)
               for s in range(args.batches)]
    first = train(args, batches, patched=False)
    runs = {"unpatched again": train(args, batches, patched=False), "patched": train(args, batches, patched=True)}
    print(f"run 1 (unpatched): assigners {first['kinds']}; final loss items {first['losses'][-1].tolist()}")
    for w in first["warnings"]:
        print(f"  warning: {w}")
    ok = True
    for name, run in runs.items():
        c = compare(first, run)
        n_items = sum(t.numel() for t in first["losses"])
        print(f"{name:>16}: assigners {run['kinds']}; loss steps differing {len(c['loss_steps'])}/{args.steps} "
              f"({n_items} values), model tensors differing {len(c['model'])}/{c['n_model']}, "
              f"optimiser tensors differing {len(c['opt'])}/{c['n_opt']}"
              + (f"; first differing step {c['loss_steps'][0]}" if c["loss_steps"] else ""))
        ok &= not (c["loss_steps"] or c["model"] or c["opt"])
    if args.task == "rtdetr" and compare(first, runs["unpatched again"])["loss_steps"]:
        same, calls = shadow_matches(args, batches)
        print(f"the unpatched runs differ from each other (the model is not deterministic here): the matches compared "
              f"call by call instead, in one unpatched run of {args.steps} steps: {same} of {calls} matcher calls "
              f"identical")
        ok = same == calls
    print("IDENTICAL" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
