"""``lucid-assign run [--backend B] [--trainers LIST] [--matcher MODULE:CLASS ...] -- COMMAND ...``: COMMAND (``python
train.py``, ``torchrun ...``, ``accelerate launch ...``, ``yolo ...``) replaces this process, with lucid_assign/_site
first on PYTHONPATH and what to patch in LUCID_ASSIGN_RUN: every Python process it starts (ranks and spawned workers
included, as they inherit the environment) patches each named trainer and matcher when its module is first imported,
and nothing else. COMMAND keeps this process, so its exit status and signals are the command's own.

Imported first by the package (``lucid_assign/__init__.py``), before torch: in the process that ``lucid-assign run``
(or ``python -m lucid_assign run``) starts, ``start_if_launching()`` checks the arguments and starts COMMAND there,
so that the launch costs an interpreter's start and no more.
"""

from __future__ import annotations

import os
import re
import sys

TRAINERS = ("ultralytics", "transformers", "rfdetr")
BACKENDS = ("auto", "kernel", "reference")  # dispatch.BACKENDS (not imported here: it imports torch)
ENV = "LUCID_ASSIGN_RUN"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
_MATCHER = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"  # MODULE:CLASS

USAGE = "usage: lucid-assign run [-h] [--backend {auto,kernel,reference}] [--trainers LIST] [--matcher MODULE:CLASS] " \
        "[--] COMMAND [ARG ...]"
HELP = f"""{USAGE}

Runs COMMAND so that every Python process it starts (ranks and spawned workers included) patches each named trainer
and matcher when its module is first imported, and nothing else. COMMAND's exit status and signals pass through.

  lucid-assign run -- python train.py --config configs/rtdetr.yml
  lucid-assign run --matcher src.zoo.rtdetr.matcher:HungarianMatcher -- torchrun --nproc_per_node 8 train.py
  lucid-assign run --trainers ultralytics -- yolo obb train data=DOTAv1.yaml model=yolo26n-obb.yaml

options:
  -h, --help            show this help and exit
  --backend {{auto,kernel,reference}}
                        lucid-assign's backend (default auto: the kernel where it can run, else the trainer's own
                        code, said once); LUCID_ASSIGN_BACKEND overrides it
  --trainers LIST       the trainers to patch, comma-separated, from {', '.join(TRAINERS)} (default: all three;
                        "none": none); each is patched when its module is first imported
  --matcher MODULE:CLASS
                        a DETR-style matcher class to patch (lucid_assign.integrations.detr), when MODULE is first
                        imported; repeat for several
"""


class UsageError(Exception):
    pass


def parse(args: list) -> tuple:
    """(backend, trainers, matchers, command) from the arguments after ``run``; UsageError for a bad one."""
    backend, trainers, matchers = "auto", list(TRAINERS), []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-h", "--help"):
            print(HELP, end="")
            raise SystemExit(0)
        name, eq, value = arg.partition("=")
        if name not in ("--backend", "--trainers", "--matcher"):
            if arg.startswith("-"):
                raise UsageError(f"unrecognized option {arg!r} (the command goes after --)")
            break
        if not eq:
            i += 1
            if i == len(args):
                raise UsageError(f"{name} needs a value")
            value = args[i]
        if name == "--backend":
            if value not in BACKENDS:
                raise UsageError(f"--backend: invalid choice {value!r} (choose from {', '.join(BACKENDS)})")
            backend = value
        elif name == "--trainers":
            trainers = [] if value == "none" else [t.strip() for t in value.split(",") if t.strip()]
            unknown = [t for t in trainers if t not in TRAINERS]
            if unknown:
                raise UsageError(f"--trainers: unknown {', '.join(map(repr, unknown))} (choose from "
                                 f"{', '.join(TRAINERS)}, or none)")
        else:
            if not re.match(_MATCHER, value):
                raise UsageError(f"--matcher: {value!r} is not MODULE:CLASS (e.g. models.matcher:HungarianMatcher)")
            matchers.append(value)
        i += 1
    command = args[i:]
    if not command:
        raise UsageError("no COMMAND to run (e.g. lucid-assign run -- python train.py)")
    return backend, list(dict.fromkeys(trainers)), list(dict.fromkeys(matchers)), command


def environment(backend: str, trainers: list, matchers: list, base=None) -> dict:
    """COMMAND's environment: ``base`` (default os.environ) with the hook's folder first on PYTHONPATH and what to
    patch in LUCID_ASSIGN_RUN."""
    env = dict(os.environ if base is None else base)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != SITE]
    env["PYTHONPATH"] = os.pathsep.join([SITE, *paths])
    env[ENV] = f"backend={backend};trainers={','.join(trainers)};matchers={','.join(matchers)}"
    return env


def main(args: list) -> int:
    """Start COMMAND in place of this process; returns (an exit status) only where it cannot."""
    try:
        backend, trainers, matchers, command = parse(args)
    except UsageError as e:
        print(f"{USAGE}\nlucid-assign run: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, environment(backend, trainers, matchers))
    except OSError as e:  # as a shell says it: 127 not found, 126 not executable
        print(f"lucid-assign run: {command[0]}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    return 0  # not reached


def _launching() -> bool:
    """Whether this process was started as ``lucid-assign run ...`` or ``python -m lucid_assign run ...`` (and the
    package is being imported for it)."""
    argv = sys.argv
    if len(argv) < 2 or argv[1] != "run":
        return False
    if os.path.basename(argv[0]) in ("lucid-assign", "lucid-assign.exe"):
        return True
    orig = getattr(sys, "orig_argv", [])
    return argv[0] == "-m" and any(orig[k:k + 3] == ["-m", "lucid_assign", "run"] for k in range(len(orig)))


def start_if_launching() -> None:
    """In the process ``lucid-assign run`` starts: COMMAND in its place (or exit with the error), before the package
    imports torch. Anywhere else: nothing."""
    if _launching():
        sys.exit(main(sys.argv[2:]))
