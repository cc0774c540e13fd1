"""Which rule set of lucid-assign reproduces each assigner of a peer (ultralytics) release: the survey behind
docs/releases.md, runnable against any release.

    python scripts/peer_rules.py                      # the ultralytics importable here
    python scripts/peer_rules.py --cache DIR 8.3.228 8.4.100 8.4.190

With versions, each release is installed without its dependencies into DIR/VERSION (pip install --no-deps --target,
skipped when already there) and checked in a subprocess with that folder first on sys.path; the dependencies the
releases import (torch, numpy, opencv, ...) must be installed here. The check is patch()'s own
(lucid_assign.integrations.ultralytics.check_peer): each assigner class the release has, run on the built-in
adversarial batches on the CPU with ties to the lower index, against lucid-assign's reference under each rule set.
Prints one line per release, then the releases grouped by identical results, as a Markdown table (--json: the raw
results).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_ONE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
out = {}
try:
    import ultralytics
    from lucid_assign.integrations import ultralytics as integ
    from lucid_assign.integrations._peer import find_peer
    peer = find_peer()
    out["version"] = peer.version
    out["classes"] = {name: list(found) for name, found in integ.check_peer(peer.tal).items()}
    out["losses"] = [m.__name__ for m in peer.losses]
    out["ddp"] = callable(getattr(peer.dist, "generate_ddp_file", None))
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print("LUCID-RESULT " + json.dumps(out))
"""


def _key(version: str):
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def check(folder: str | None) -> dict:
    """The results for the release in ``folder`` (None: the one importable here), from a fresh interpreter."""
    env = dict(os.environ, LUCID_ASSIGN_DISABLE_EXT="1", YOLO_OFFLINE="1")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, repo, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", _ONE], env=env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("LUCID-RESULT "):
            return json.loads(line[len("LUCID-RESULT "):])
    return {"error": (proc.stderr.strip().splitlines() or ["no result"])[-1]}


def install(version: str, cache: str) -> str:
    folder = os.path.join(cache, version)
    if not os.path.isdir(os.path.join(folder, "ultralytics")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", folder,
                        f"ultralytics=={version}"], check=True)
    return folder


def summary(result: dict) -> str:
    if "error" in result:
        return f"cannot be checked here ({result['error']})"
    parts = [f"{name}: {rules or 'left to the peer'}" for name, (rules, _) in result["classes"].items()]
    return "; ".join(parts)


def table(results: list) -> str:
    """Consecutive releases with the same results, one row each."""
    rows, last = [], None
    for version, result in results:
        s = summary(result)
        if rows and s == last:
            rows[-1][1] = version
        else:
            rows.append([version, version, s])
        last = s
    lines = ["| releases | what patch() does |", "| --- | --- |"]
    lines += [f"| {a}{'' if a == b else ' - ' + b} | {s} |" for a, b, s in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", help="releases to install into --cache and check")
    parser.add_argument("--cache", default=None, help="folder of the installed releases (one subfolder each)")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args(argv)
    if args.versions and not args.cache:
        parser.error("--cache: versions need a folder to install them into")
    results = []
    for version in sorted(args.versions, key=_key) or [None]:
        try:
            result = check(install(version, args.cache) if version else None)
        except subprocess.CalledProcessError:
            result = {"error": f"pip cannot install ultralytics=={version}"}
        results.append((result.get("version", version), result))
        print(f"{results[-1][0]}: {summary(result)}", file=sys.stderr, flush=True)
    print(json.dumps(dict(results), indent=1) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
