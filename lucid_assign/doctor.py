"""``lucid-assign doctor``: what is installed and built, what ``backend="auto"`` will use, a self-check of every
available kernel against the reference, and, where the peer trainer is installed, the check that ``patch()`` runs
against it. Exits 0 when every check passed, 1 when one failed or when no kernel could be checked at all (the library
not loaded, say): a doctor that checked nothing says so."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time

import torch

from . import _library, api, dispatch, lsap, ops, reference
from .reference import INPUTS
from .synthetic import dota_like_batch



def _version(cmd, last: bool = False) -> str | None:
    """First (or last) non-empty line a command prints, or None when it cannot run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    if not lines:
        return None
    return lines[-1] if last else lines[0]


def installed_version() -> str:
    """The installed distribution's version (with a wheel's +pt..cu.. tag), else the package's own."""
    try:
        return importlib.metadata.version("lucid-assign")
    except importlib.metadata.PackageNotFoundError:
        from ._version import __version__

        return f"{__version__} (not installed as a distribution)"


def peer_version() -> str | None:
    """The installed peer's version, without importing it, or None."""
    try:
        return importlib.metadata.version("ultralytics")
    except importlib.metadata.PackageNotFoundError:
        return None


def report() -> list:
    lines = [f"python {sys.version.split()[0]} ({platform.platform()})",
             f"torch {torch.__version__}, built with CUDA {torch.version.cuda}"]
    cxx = os.environ.get("CXX", "c++")
    lines.append(f"C++ compiler ({cxx}): {_version([cxx, '--version']) or 'not found'}")
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
                                    if os.environ.get("CUDA_HOME") else None)
    lines.append(f"nvcc: {_version([nvcc, '--version'], last=True) if nvcc else 'not found'}")
    lines.append(f"lucid-assign {installed_version()} at {os.path.dirname(os.path.abspath(__file__))}")
    if _library.loaded():
        lines.append("compiled library: loaded (lucid_assign._C)")
    else:
        lines.append(f"compiled library: NOT loaded: {_library.LOAD_ERROR}")
        lines.append(f"  fix: {_library.LOAD_FIX}")
    info = _library.BUILD
    if info:
        lines.append(f"built with torch {info.get('torch')}, CUDA kernels {'on' if info.get('cuda') else 'off'} "
                     f"({info.get('why')}), TORCH_CUDA_ARCH_LIST={info.get('arch_list')}")
        if info.get("compiler"):
            lines.append(f"CUDA compiler of the build: {info['compiler']}")
    else:
        lines.append("build info: none (the library was not built by this package's setup.py)")
    lines.append(f"ultralytics (the peer trainer): {peer_version() or 'not installed'}")
    b = dispatch.backends()
    lines.append(f"ops with a CPU kernel: {', '.join(b['cpu_ops']) or 'none'}")
    lines.append(f"ops with a CUDA kernel: {', '.join(b['cuda_ops']) or 'none'}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            lines.append(f"GPU {i}: {torch.cuda.get_device_name(i)}, compute capability {major}.{minor}")
        lines.append(f"torch's CUDA architectures: {' '.join(torch.cuda.get_arch_list())}")
    else:
        lines.append("GPU: none visible to torch")
    for device, choice in b["auto"].items():
        lines.append(f"backend='auto' for float32 {device} tensors: {choice}")
    if b["forced"]:
        lines.append(f"LUCID_ASSIGN_BACKEND={b['forced']} overrides the backend argument")
    return lines


def _compare(got, want, exact: bool) -> str | None:
    names = ("target_labels", "target_bboxes", "target_scores", "fg_mask", "target_gt_idx")
    for i, name in enumerate(names):
        a, b = got[i], want[i]
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{name}: {a.dtype}{tuple(a.shape)} vs reference {b.dtype}{tuple(b.shape)}"
        if i == 2 and not exact:
            scale = b.abs().clamp(min=torch.finfo(b.dtype).tiny)
            rel = float(((a - b).abs() / scale).max()) if b.numel() else 0.0
            if rel > 1e-6 or bool(((a != 0) != (b != 0)).any()):
                return f"{name}: relative difference {rel:.3g} (allowed 1e-6)"
        elif not torch.equal(a, b):
            return f"{name}: {int((a != b).sum())} of {a.numel()} elements differ"
    return None


def self_check() -> list:
    """(device, kind, status, detail) for each available kernel backend against the reference."""
    results = []
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for obb in (False, True):
            kind = "OBB" if obb else "HBB"
            batch = dota_like_batch(batch=2, img_size=256, num_classes=7, objects=(5, 40), obb=obb, seed=1)
            x = [batch[k].to(device) for k in INPUTS]
            why = dispatch.kernel_unsupported(x[0], x[1], x[2], x[4])
            if why:
                results.append((device, kind, "SKIP", why))
                continue
            kw = dict(topk=10, topk2=4, num_classes=7, alpha=0.5, beta=6.0, stride=batch["stride"])
            try:
                want = reference.assign(*x, **kw)
                got = api.assign(*x, backend="kernel", **kw)
                diff = _compare(got, want, exact=device == "cuda")
            except Exception as exc:  # a crash is a failure to report, not to raise
                diff = f"{type(exc).__name__}: {exc}"
            results.append((device, kind, "FAIL" if diff else "PASS", diff or "equal to the reference"))
        results.append(_matching_check(device))
    return results


def _matching_check(device: str) -> tuple:
    """The linear sum assignment kernel against the reference on a batch of small-integer costs (many exact ties),
    with a forbidden column and ragged sizes."""
    if not _library.has_kernel("linear_sum_assignment", device):
        return device, "LSAP", "SKIP", f"no linear_sum_assignment kernel for {device}"
    g = torch.Generator().manual_seed(2)
    cost = torch.randint(0, 4, (4, 9, 6), generator=g).float()
    cost[0, :, 2] = float("inf")
    sizes = torch.tensor([6, 3, 0, 5])
    try:
        want = lsap.linear_sum_assignment(cost, sizes)
        got = ops.linear_sum_assignment(cost.to(device), sizes)
        same = all(torch.equal(a.cpu(), b) for a, b in zip(got, want))
        diff = None if same else "the matches differ from the reference's"
    except Exception as exc:  # a crash is a failure to report, not to raise
        diff = f"{type(exc).__name__}: {exc}"
    return device, "LSAP", "FAIL" if diff else "PASS", diff or "equal to the reference"


def patch_check() -> tuple:
    """(status, detail) of the check patch() runs against the installed peer: PASS, FAIL (patch() would refuse), or
    SKIP when the peer is not installed."""
    if peer_version() is None:
        return "SKIP", "ultralytics is not installed (pip install 'lucid-assign[ultralytics]')"
    from .integrations import ultralytics as integ
    from .integrations._peer import find_peer

    try:
        peer = find_peer()
        start = time.perf_counter()
        found = integ.check_peer(peer.tal)
    except Exception as exc:  # a release patch() cannot take: its reason is the result
        return "FAIL", f"patch() cannot patch it: {type(exc).__name__}: {exc}"
    each = "; ".join(f"{name}: rule set {rules}" if rules else f"{name}: left to ultralytics ({why})"
                     for name, (rules, why) in found.items())
    matcher = integ.check_matcher_of_peer()
    if matcher is not None:
        variant, why = matcher
        each += f"; HungarianMatcher: {integ.describe_variant(variant)}" if variant else \
            f"; HungarianMatcher: left to ultralytics ({why})"
    took = f"{(time.perf_counter() - start) * 1e3:.0f} ms on the CPU"
    if not any(rules for rules, _ in found.values()):
        return "FAIL", f"ultralytics {peer.version} assigns differently ({each}): patch() refuses it ({took})"
    return "PASS", f"ultralytics {peer.version}: {each} ({took})"


def run(args) -> int:
    for line in report():
        print(line)
    print("\nself-check (kernel vs reference on a random batch):")
    results = self_check()
    for device, kind, status, detail in results:
        print(f"  {status:<4} {device:<4} {kind}: {detail}")
    status, detail = patch_check()
    print(f"\npatch self-check (what patch() checks before it patches the peer):\n  {status:<4} {detail}")
    failed = [r for r in results if r[2] == "FAIL"] + ([status] if status == "FAIL" else [])
    if failed:
        print(f"\n{len(failed)} check(s) FAILED")
        return 1
    if not any(r[2] == "PASS" for r in results):
        why = _library.LOAD_ERROR or "no kernel can run here"
        print(f"\nno kernel was checked ({why}): nothing here shows that the kernels work. Fix: "
              f"{_library.LOAD_FIX or 'build lucid-assign with its kernels'}")
        return 1
    print("\nall checks passed")
    return 0
