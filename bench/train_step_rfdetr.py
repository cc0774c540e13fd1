"""Training-step benchmark of RF-DETR with and without lucid_assign.integrations.rfdetr.patch(), in one run.

    python bench/train_step_rfdetr.py                        # GPU: RF-DETR Small, Base and Medium, batch 4, bf16
    python bench/train_step_rfdetr.py --out docs/bench-step-rfdetr.json   # and the record the README's figures use
    python bench/train_step_rfdetr.py --variant small --objects 50
    python bench/train_step_rfdetr.py --device cpu --variant small --imgsz 128 --batch 2 --objects 5 --steps 2

Each model is built from its rfdetr config (RFDETRSmallConfig, RFDETRBaseConfig, RFDETRMediumConfig; 90 classes, no
weights: none is loaded or fetched) at its own resolution (512, 560 and 576 px) unless --imgsz says otherwise, with its
training defaults: 300 queries in 13 groups, two-stage, auxiliary losses. A step is what RF-DETR's trainer does under
bf16-mixed: the forward pass and the criterion (which matches the final, auxiliary and encoder layers) under bf16
autocast, the weighted loss, backward and an AdamW step, on DOTA-like axis-aligned objects (lucid_assign.synthetic). Its
own matcher solves with torch-linear-assignment on CUDA (pip install torch-hungarian: RF-DETR's train extra) and SciPy
on the CPU. Both variants are built from one seed and their steps alternate. It reports the median step time and, from
separate instrumented steps, the matching's time: each matcher call of the criterion (its _match_many, and each layer's
forward where that declines) timed between two device synchronisations (its host and GPU work, overlapped with nothing:
an upper bound of its cost in the step), and its share of the step.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import alternated, detr_batch, paired_case, sync  # noqa: E402
from lucid_assign.integrations import rfdetr as lr  # noqa: E402

VARIANTS = {"small": "RFDETRSmallConfig", "base": "RFDETRBaseConfig", "medium": "RFDETRMediumConfig"}
CLASSES = 90


def build(variant: str, imgsz: int | None, device):
    import rfdetr.config as rc
    from rfdetr.models.lwdetr import build_criterion_from_config, build_model_from_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no pretrained weights: said by RF-DETR at each build
        config_cls = getattr(rc, VARIANTS[variant])
        extra = {}
        if imgsz:
            patch = config_cls.model_fields["patch_size"].default
            extra = dict(resolution=imgsz, positional_encoding_size=imgsz // patch)
        # (the config names its checkpoint, which building the model does not load; with none, the Base's DINOv2
        # backbone would be fetched from the hub)
        config = config_cls(num_classes=CLASSES, device=str(device), **extra)
        train = rc.TrainConfig(dataset_dir=".", output_dir=".")
        torch.manual_seed(0)
        model = build_model_from_config(config, train).to(device).train()
        criterion, _ = build_criterion_from_config(config, train)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    return model, criterion.to(device).train(), opt, config.resolution


def step(model, criterion, opt, images, targets, device):
    from rfdetr.utilities.tensors import NestedTensor

    mask = torch.zeros(images.shape[0], *images.shape[2:], dtype=torch.bool, device=images.device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        outputs = model(NestedTensor(images, mask))
        parts = criterion(outputs, targets)
        loss = torch.stack([parts[k] * criterion.weight_dict[k] for k in parts if k in criterion.weight_dict]).sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


@contextlib.contextmanager
def timed_matcher(device, spans: list):
    """Each matcher call of the criterion (_match_many; forward where the criterion calls it), patched or not, timed
    between two synchronisations."""
    from rfdetr.models.matcher import HungarianMatcher as cls

    many, forward = cls._match_many, cls.forward
    inside = [0]

    def timed(inner):
        def call(self, *args, **kwargs):
            if inside[0]:
                return inner(self, *args, **kwargs)
            sync(device)
            t0 = time.perf_counter()
            inside[0] += 1
            try:
                return inner(self, *args, **kwargs)
            finally:
                inside[0] -= 1
                sync(device)
                spans.append(time.perf_counter() - t0)
        return call

    cls._match_many, cls.forward = timed(many), timed(forward)
    try:
        yield
    finally:
        cls._match_many, cls.forward = many, forward


def measure(args, variant: str, objects: int) -> list:
    device = args.device
    runs = []
    for patched in (False, True):
        model, criterion, opt, imgsz = build(variant, args.imgsz, device)
        runs.append(dict(patched=patched, model=model, criterion=criterion, opt=opt, times=[]))
    batches = [detr_batch(args.batch, imgsz, objects, seed, device, CLASSES, "labels") for seed in range(3)]
    contexts = {False: contextlib.nullcontext, True: lambda: lr.patched("kernel")}

    def one(r, i):
        step(r["model"], r["criterion"], r["opt"], *batches[i % 3], device)

    for r in runs:
        with contexts[r["patched"]]():
            for i in range(args.warmup):
                one(r, i)
    sync(device)
    alternated(runs, args.steps, contexts, one, device)
    for r in runs:
        per_step, calls = [], 0
        with contexts[r["patched"]]():
            for i in range(min(args.steps, 5)):
                spans = []
                with timed_matcher(device, spans):
                    one(r, i)
                    sync(device)
                per_step.append(sum(spans))
                calls = len(spans)
        r.update(objects=objects, imgsz=imgsz, step_s=statistics.median(r["times"]),
                 matcher_s=statistics.median(per_step), calls=calls)
        del r["model"], r["criterion"], r["opt"]
    return runs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--variant", choices=list(VARIANTS), nargs="+", default=list(VARIANTS))
    p.add_argument("--imgsz", type=int, default=None, help="default: the variant's resolution")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--objects", type=int, nargs="+", default=[10, 50, 200])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", help="write the record (JSON) here")
    args = p.parse_args(argv)
    import rfdetr

    print(f"batch {args.batch}, bf16 autocast, {args.device}, torch {torch.__version__}, rfdetr "
          f"{getattr(rfdetr, '__version__', lr._version())}"
          f"{', ' + torch.cuda.get_device_name() if args.device == 'cuda' else ''}")
    print(f"{'variant':<7} {'px':>4} {'objects':>7} {'matcher':<8} {'step ms':>9} {'matching ms (calls)':>20} "
          f"{'share':>7}")
    results = []
    for variant in args.variant:
        for objects in args.objects:
            runs = measure(args, variant, objects)
            for r in runs:
                print(f"{variant:<7} {r['imgsz']:>4} {objects:>7} {'patched' if r['patched'] else 'own':<8} "
                      f"{r['step_s'] * 1e3:9.1f} {r['matcher_s'] * 1e3:14.2f} ({r['calls']}) "
                      f"{100 * r['matcher_s'] / r['step_s']:6.2f}%")
            results.append(paired_case(*runs, 20, variant=variant, imgsz=runs[0]["imgsz"], objects=objects))
    if args.out:
        env = dict(torch=torch.__version__, cuda=torch.version.cuda, rfdetr=lr._version(),
                   gpu=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                   date=datetime.date.today().isoformat())
        with open(args.out, "w") as f:
            json.dump(dict(environment=env, args=vars(args), results=results), f, indent=1)


if __name__ == "__main__":
    main()
