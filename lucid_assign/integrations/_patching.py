"""The state that a trainer integration's patch(), unpatch(), patched() and patch_report() share: what patch()
replaced, the backend, what was said once, and the word that the patch took effect. A leaf module: every integration
imports it, it imports none of them."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Callable

from ..dispatch import ENV_BACKEND, FallbackWarning, warn_caller

VERBOSE_ENV = "LUCID_ASSIGN_VERBOSE"


class PatchState:
    """One trainer integration's patch: ``originals`` (what patch() replaced -> the trainer's own object; None while
    not patched), ``backend`` (patch()'s), ``report`` (name -> what patch() did with it), and the messages said once.
    ``logger()`` gives the logger through which the first patched call is announced (the trainer's own, so that its
    verbosity settings apply); ``patched_words`` the announcement's words for what is patched."""

    def __init__(self, trainer: str, patched_words: str, logger: Callable):
        self.trainer = trainer
        self.patched_words = patched_words
        self.originals: dict | None = None
        self.backend = "auto"
        self.report: dict = {}
        self.said: set = set()
        self.announced = False
        self.lock = threading.RLock()
        self._logger = logger

    def is_patched(self) -> bool:
        return self.originals is not None

    def original(self, name: str):
        """The trainer's own object that patch() replaced under ``name`` (a key, or a key's last part), or None."""
        for key, obj in (self.originals or {}).items():
            if key == name or (isinstance(key, tuple) and key[-1] == name):
                return obj
        return None

    def effective_backend(self) -> str:
        """The backend the patched code runs with: LUCID_ASSIGN_BACKEND when set, else patch()'s argument."""
        return os.environ.get(ENV_BACKEND) or self.backend

    def say_once(self, message: str) -> None:
        """A FallbackWarning at the caller's line, once per message and process."""
        if message not in self.said:
            self.said.add(message)
            warn_caller(message, FallbackWarning)

    def verbose(self, message: str) -> None:
        """With LUCID_ASSIGN_VERBOSE=1: the message on stderr with the process (and the rank of a multi-GPU run)."""
        if os.environ.get(VERBOSE_ENV, "0") not in ("", "0"):
            rank = _rank()
            where = f"rank {rank}, " if rank is not None else ""
            print(f"lucid-assign [{where}pid {os.getpid()}]: {message}", file=sys.stderr, flush=True)

    def announce(self, first_call: str, version: str) -> None:
        """Say once per process, through the logger, that the patch took effect: lucid-assign's version, and what the
        first patched call ran where."""
        if not self.announced:
            self.announced = True
            self._logger().info(f"lucid-assign {version}: {self.patched_words}; the first call: {first_call}")


def _rank():
    """This process's rank in a multi-process run: its process group's (Lightning's ranks, say), else RANK (torchrun
    sets it before the group exists), else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return str(dist.get_rank())
    return os.environ.get("RANK")


@contextlib.contextmanager
def patched(state: PatchState, patch: Callable, unpatch: Callable, backend: str):
    """An integration's ``with patched(backend):``: ``patch(backend)`` for the block, then the state before it again:
    unpatched, or patched with the backend it had."""
    was, before = state.is_patched(), state.backend
    patch(backend)
    try:
        yield
    finally:
        if was:
            patch(before)
        else:
            unpatch()


def _ultralytics_logger():
    from ._peer import first_module

    return first_module(("ultralytics.utils", "ultralytics.yolo.utils")).LOGGER


def _lucid_logger():
    import logging

    return logging.getLogger("lucid_assign")


ULTRALYTICS = PatchState("ultralytics", "ultralytics' assigners are patched", _ultralytics_logger)
TRANSFORMERS = PatchState("transformers", "transformers' matchers are patched", _lucid_logger)
RFDETR = PatchState("RF-DETR", "RF-DETR's matcher is patched", _lucid_logger)
DETR = PatchState("DETR matchers", "DETR-style matchers are patched", _lucid_logger)
