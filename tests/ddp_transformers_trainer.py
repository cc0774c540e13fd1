"""A transformers ``Trainer`` run as torchrun starts it: one process a rank (here on the CPU, over gloo), each running
this script. The script patches its own process, as a user's training script does, trains a tiny DETR with auxiliary
losses a few steps on random images, and checks every matcher call of its rank against transformers' own matcher on
the same inputs (SciPy on the host). Each rank says on stderr what ran and how many calls agreed:

    lucid-assign-check rank R: N matcher calls, N the same as transformers' own; patched True

    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_transformers_trainer.py OUTPUT_DIR
    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_transformers_trainer.py OUTPUT_DIR --cuda  # NCCL
"""

import os
import sys

import torch
import transformers as tf
from transformers.loss import loss_for_object_detection

from lucid_assign.integrations import transformers as lt

IMAGES, SIDE = 8, 64


class Images(torch.utils.data.Dataset):
    """Random images with 0 to 4 objects each (normalised cx cy w h boxes), the same on every rank."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.items = []
        for i in range(IMAGES):
            n = i % 5
            centres, sides = 0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)
            boxes = torch.cat([centres, sides], 1)
            self.items.append({"pixel_values": torch.rand(3, SIDE, SIDE, generator=g),
                               "labels": {"class_labels": torch.randint(0, 4, (n,), generator=g), "boxes": boxes}})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(items):
    return {"pixel_values": torch.stack([x["pixel_values"] for x in items]), "labels": [x["labels"] for x in items]}


def checked(cls, calls: list):
    """The class's (patched) forward, each call also run by transformers' own forward on the same inputs."""
    patched, own = cls.forward, lt.STATE.originals[cls]

    def forward(self, outputs, targets, *args, **kwargs):
        ours = patched(self, outputs, targets, *args, **kwargs)
        theirs = own(self, outputs, targets, *args, **kwargs)
        calls.append(len(ours) == len(theirs) and all(
            torch.equal(a.cpu(), c.cpu()) and torch.equal(b.cpu(), d.cpu()) for (a, b), (c, d) in zip(ours, theirs)))
        return ours

    cls.forward = forward


def main(output_dir: str, cuda: bool = False):
    lt.patch()
    calls: list = []
    checked(loss_for_object_detection.HungarianMatcher, calls)
    torch.manual_seed(0)
    config = tf.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=tf.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1], layer_type="basic",
        out_features=["stage4"]), encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, d_model=16, num_queries=6, num_labels=4,
        auxiliary_loss=True)
    args = tf.TrainingArguments(output_dir=output_dir, per_device_train_batch_size=2, max_steps=3, use_cpu=not cuda,
                                ddp_backend="nccl" if cuda else "gloo", ddp_find_unused_parameters=True, report_to=[],
                                save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                                remove_unused_columns=False)
    trainer = tf.Trainer(model=tf.DetrForObjectDetection(config), args=args, train_dataset=Images(),
                         data_collator=collate)
    trainer.train()
    rank = os.environ.get("RANK", "?")
    print(f"lucid-assign-check rank {rank}: {len(calls)} matcher calls, {sum(calls)} the same as transformers' own; "
          f"patched {lt.is_patched()}; world size {trainer.args.world_size}", file=sys.stderr, flush=True)
    if torch.distributed.is_initialized():  # the ranks end together, their process group taken down (a rank that
        # exits with it alive may abort in its teardown: "terminate called without an active exception")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], "--cuda" in sys.argv[2:])
