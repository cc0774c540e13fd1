"""RF-DETR's model and criterion trained by Lightning's DDP strategy on the CPU (two ranks, gloo), as RF-DETR's own
trainer trains them: Lightning starts the other rank by running this script again, so the script's patch() patches
every rank, as a user's training script does. Each rank checks every call of the patched matcher against RF-DETR's
own (SciPy, its CPU path) on the same inputs and says on stderr what ran and how many calls agreed:

    lucid-assign-check rank R: N matcher calls, N the same as RF-DETR's own; patched True; world size 2

    python tests/ddp_rfdetr_lightning.py
    python tests/ddp_rfdetr_lightning.py --cuda   # two GPUs, NCCL
"""

import os
import sys
import warnings

import pytorch_lightning as pl
import torch

from lucid_assign.integrations import rfdetr as lr

SIDE, CLASSES = 64, 5


def build():
    from rfdetr.config import RFDETRSmallConfig, TrainConfig
    from rfdetr.models.lwdetr import build_criterion_from_config, build_model_from_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = RFDETRSmallConfig(pretrain_weights=None, num_classes=CLASSES, device="cpu", resolution=SIDE,
                                   positional_encoding_size=SIDE // 16, num_queries=10, group_detr=2)
        train = TrainConfig(dataset_dir=".", output_dir=".")
        torch.manual_seed(0)
        return build_model_from_config(config, train), build_criterion_from_config(config, train)[0]


class Images(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.items = []
        for i in range(8):
            n = 1 + i % 4
            centres, sides = 0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)
            boxes = torch.cat([centres, sides], 1)
            self.items.append((torch.rand(3, SIDE, SIDE, generator=g),
                               {"boxes": boxes, "labels": torch.randint(0, CLASSES, (n,), generator=g)}))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(items):
    return torch.stack([x for x, _ in items]), [t for _, t in items]


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model, self.criterion = build()

    def training_step(self, batch, index):
        from rfdetr.utilities.tensors import NestedTensor

        images, targets = batch
        mask = torch.zeros(images.shape[0], SIDE, SIDE, dtype=torch.bool, device=images.device)
        parts = self.criterion(self.model(NestedTensor(images, mask)), targets)
        return sum(parts[k] * self.criterion.weight_dict[k] for k in parts if k in self.criterion.weight_dict)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def checked(calls: list):
    """The patched _match_many, each call also matched by RF-DETR's own matcher (its own classes, for that call)."""
    from rfdetr.models.matcher import HungarianMatcher

    patched = HungarianMatcher._match_many

    def own(m, outputs_list, targets, kwargs):
        replaced = {(owner, name): getattr(owner, name) for owner, name in lr.STATE.originals}
        for (owner, name), obj in lr.STATE.originals.items():
            setattr(owner, name, obj)
        try:
            found = HungarianMatcher._match_many(m, outputs_list, targets, **kwargs)
            return found if found is not None else [m.forward(o, targets, **kwargs) for o in outputs_list]
        finally:
            for (owner, name), obj in replaced.items():
                setattr(owner, name, obj)

    def match_many(self, outputs_list, targets, **kwargs):
        ours = patched(self, outputs_list, targets, **kwargs)
        if ours is not None:
            theirs = own(self, outputs_list, targets, kwargs)
            calls.append([[(a.tolist(), b.tolist()) for a, b in layer] for layer in ours]
                         == [[(a.tolist(), b.tolist()) for a, b in layer] for layer in theirs])
        return ours

    HungarianMatcher._match_many = match_many


def main(cuda: bool = False):
    lr.patch()
    calls: list = []
    checked(calls)
    trainer = pl.Trainer(accelerator="gpu" if cuda else "cpu", devices=2, strategy="ddp_find_unused_parameters_true",
                         max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    loader = torch.utils.data.DataLoader(Images(), batch_size=2, collate_fn=collate)
    trainer.fit(Module(), loader)
    print(f"lucid-assign-check rank {trainer.global_rank}: {len(calls)} matcher calls, {sum(calls)} the same as "
          f"RF-DETR's own; patched {lr.is_patched()}; world size {trainer.world_size}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main("--cuda" in sys.argv[1:])
