"""The snippets of the README and docs/ run as written and print what they say: every Python block is a ``pycon``
block (prompts and the output they print), run here with doctest, block after block of one file in one namespace.
Shell blocks are not run here (they train on downloaded datasets, need a GPU, or are the README's two commands, which
CI runs); each command they hold that calls ``lucid-assign`` is checked to parse."""

import doctest
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)


def _blocks(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        text = f.read()
    for m in FENCE.finditer(text):
        yield m.group(1), m.group(2), text[: m.start()].count("\n") + 1


def test_every_python_snippet_is_a_checked_pycon_block():
    """A block says what it is (text for what is not code), and Python is written as pycon, outputs shown."""
    unchecked = [(name, line) for name in DOCS for lang, _, line in _blocks(name) if lang in ("python", "py", "")]
    assert not unchecked, f"blocks that are neither pycon nor another named language: {unchecked}"


@pytest.mark.parametrize("name", [n for n in DOCS if any(lang == "pycon" for lang, _, _ in _blocks(n))])
def test_pycon_snippets_run_and_print_what_they_say(name, library, peer_tal, monkeypatch):
    monkeypatch.delenv("LUCID_ASSIGN_BACKEND", raising=False)
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs = {}
    try:
        for lang, code, line in _blocks(name):
            if lang != "pycon":
                continue
            test = parser.get_doctest(code, globs, f"{name}:{line}", name, line)
            result = runner.run(test, clear_globs=False)
            globs = test.globs  # (DocTest copies the namespace it is given) the next block goes on from this one
            assert result.failed == 0, f"{name}, the block at line {line}: {result.failed} example(s) printed " \
                "something else (doctest's report above)"
    finally:
        from lucid_assign.integrations import ultralytics

        ultralytics.unpatch()


def test_shell_snippets_that_call_lucid_assign_parse():
    from lucid_assign import __main__ as cli

    commands = []
    for name in DOCS:
        for lang, code, line in _blocks(name):
            if lang in ("bash", "sh", "console"):
                commands += [(name, line, cmd) for cmd in code.splitlines() if cmd.startswith("lucid-assign ")]
    assert commands
    for name, line, cmd in commands:
        argv = shlex.split(cmd.split("#")[0])[1:]
        assert cli.parse(argv).command == argv[0], (name, line, cmd)


def test_the_readme_figures_are_those_of_the_benchmark_records():
    """The README's table of figures is what scripts/figures.py makes of docs/bench-cuda-*.json (so each figure keeps
    its command, machine and date)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "figures.py"), "--check",
                          os.path.join(ROOT, "README.md")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
