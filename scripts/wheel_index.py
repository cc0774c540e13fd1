"""Write the find-links pages of a folder of lucid-assign wheels (scripts/build_wheel.sh): one page per torch minor
and CUDA version (``torch-2.14-cu130.html``, ``torch-2.4-cpu.html``), each listing that group's wheels and the sdist,
and ``index.html`` listing every file, grouped, for ``pip install --find-links``.

Each wheel's local version says its group (``0.2.0+pt214cu130``: torch 2.14, CUDA 13.0) and requires that torch
minor, so pip given the page and the running torch's version takes the wheel built for it, or the sdist (a build
from source) when there is none:

    pip install lucid-assign "torch==$(python -c 'import torch; print(torch.__version__.split("+")[0])')" \\
        --find-links DIR/index.html
"""

import argparse
import html
import os
import re
import sys

WHEEL = re.compile(r"^lucid_assign-(?P<version>[^-+]+)\+pt(?P<major>\d)(?P<minor>\d+)(?P<build>cu\d+|cpu)-.+\.whl$")


def groups(folder: str) -> tuple[dict, list]:
    """{(major, minor, build): [wheel names]} and the sdists in ``folder``."""
    found, sdists = {}, []
    for name in sorted(os.listdir(folder)):
        m = WHEEL.match(name)
        if m:
            key = (int(m["major"]), int(m["minor"]), m["build"])
            found.setdefault(key, []).append(name)
        elif name.startswith("lucid_assign-") and name.endswith(".tar.gz"):
            sdists.append(name)
    return dict(sorted(found.items())), sdists


def label(key) -> str:
    major, minor, build = key
    cuda = "CPU only" if build == "cpu" else f"CUDA {build[2:-1]}.{build[-1]}"
    return f"torch {major}.{minor}, {cuda}"


def page_name(key) -> str:
    major, minor, build = key
    return f"torch-{major}.{minor}-{build}.html"


def _links(names) -> str:
    return "\n".join(f'<a href="{html.escape(n)}">{html.escape(n)}</a><br>' for n in names)


def write(folder: str) -> list:
    """Write the pages; returns their names."""
    found, sdists = groups(folder)
    if not found and not sdists:
        raise SystemExit(f"wheel_index.py: no lucid-assign wheel or sdist in {folder}")
    written = []
    for key, wheels in found.items():
        with open(os.path.join(folder, page_name(key)), "w", encoding="utf-8") as f:
            f.write(f"<!DOCTYPE html>\n<html><body>\n<h1>lucid-assign for {html.escape(label(key))}</h1>\n"
                    f"{_links(wheels + sdists)}\n</body></html>\n")
        written.append(page_name(key))
    parts = [f"<h2>{html.escape(label(k))} (<a href=\"{page_name(k)}\">page</a>)</h2>\n{_links(w)}"
             for k, w in found.items()]
    parts.append(f"<h2>source (any torch)</h2>\n{_links(sdists)}")
    with open(os.path.join(folder, "index.html"), "w", encoding="utf-8") as f:
        f.write("<!DOCTYPE html>\n<html><body>\n<h1>lucid-assign</h1>\n" + "\n".join(parts) + "\n</body></html>\n")
    written.append("index.html")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the folder of wheels and sdist (scripts/build_wheel.sh's output)")
    args = parser.parse_args(argv)
    for name in write(args.folder):
        print(os.path.join(args.folder, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
