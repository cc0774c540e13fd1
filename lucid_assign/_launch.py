"""``lucid-assign run [--backend B] [--trainers LIST] [--matcher MODULE:CLASS ...] -- COMMAND ...``: COMMAND (``python
train.py``, ``torchrun ...``, ``accelerate launch ...``, ``yolo ...``) runs with lucid_assign/_site first on PYTHONPATH
and what to patch in LUCID_ASSIGN_RUN: every Python process it starts (ranks and spawned workers included, as they
inherit the environment) patches each named trainer and matcher when its module is first imported, and nothing else.

COMMAND keeps the launcher's process, so its exit status and signals are the command's own: this environment's own
Python running a script, ``-m MODULE`` or ``-c CODE`` (with no interpreter option) runs in it, as that Python would
have run it (``sys.argv``, ``sys.path[0]``, a fresh ``__main__``), after the hook is added here; any other command
replaces it (``execvpe``). So the launch costs no second interpreter's start where it need not.

The launcher is the package's first import: ``launching()`` says whether this process was started as ``lucid-assign
run`` (or ``python -m lucid_assign run``), and then the package imports nothing more (no torch) and the console
script (lucid_assign/_console.py) or ``python -m`` (lucid_assign/__main__.py) calls ``launch``.
"""

import os
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
            import re

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


def main(args: list, here: bool = False) -> int:
    """Run COMMAND: in this process where ``here`` (the launcher, which has imported nothing of the package but this
    module) and COMMAND is this Python running code, else in place of this process; returns an exit status only
    where it cannot start COMMAND or COMMAND ran here and returned."""
    try:
        backend, trainers, matchers, command = parse(args)
    except UsageError as e:
        print(f"{USAGE}\nlucid-assign run: error: {e}", file=sys.stderr)
        return 2
    env = environment(backend, trainers, matchers)
    what = _runs_here(command) if here else None
    if what is not None:
        return _run_here(*what, env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:  # as a shell says it: 127 not found, 126 not executable
        print(f"lucid-assign run: {command[0]}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    return 0  # not reached


def _found(name: str):
    """The file that ``execvp`` would run for ``name`` (PATH searched where it has no slash), or None."""
    folders = [""] if os.sep in name else os.get_exec_path()
    for folder in folders:
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _this_python(path: str) -> bool:
    """Whether ``path`` is this process's Python in this environment: sys.executable itself, or a name of the same
    interpreter in the same folder (``python3`` beside ``python``); a Python of another environment is not."""
    if not sys.executable:
        return False
    a, b = os.path.abspath(path), os.path.abspath(sys.executable)
    return a == b or (os.path.dirname(a) == os.path.dirname(b) and os.path.realpath(a) == os.path.realpath(b))


def _plain_source(path: str) -> bool:
    """Whether Python would run the file ``path`` as source: not compiled code, not a zip archive (whose
    ``__main__.py`` Python runs instead)."""
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (1 << 16) - 22))
            tail = f.read()
    except OSError:
        return False
    return not path.endswith(".pyc") and head != magic and b"PK\x05\x06" not in tail


def _runs_here(command: list):
    """(how, what, arguments) where COMMAND is this Python running ``-c CODE``, ``-m MODULE`` or a script with no
    interpreter option before them, else None (COMMAND then replaces this process)."""
    path = _found(command[0])
    if path is None or not _this_python(path):
        return None
    rest = command[1:]
    if len(rest) >= 2 and rest[0] in ("-c", "-m"):
        if rest[0] == "-m":
            import runpy  # what python -m runs the module with

            if not callable(getattr(runpy, "_run_module_as_main", None)):
                return None
        return rest[0], rest[1], rest[2:]
    if rest and not rest[0].startswith("-") and os.path.isfile(rest[0]) and _plain_source(rest[0]):
        return "script", rest[0], rest[1:]
    return None


def _run_here(how: str, what: str, arguments: list, env: dict) -> int:
    """COMMAND in this process, as its Python would have run it in a process of its own with ``env``: the hook
    added, this launcher's modules of the package forgotten (COMMAND imports the package afresh if it does), a fresh
    ``__main__``, ``sys.argv`` and ``sys.path[0]`` as Python sets them, tracebacks that start at COMMAND's code."""
    for key in ("PYTHONPATH", ENV):
        os.environ[key] = env[key]
    bootstrap = sys.modules["_frozen_importlib"]  # the import system's own modules: loaded at every start
    external = sys.modules["_frozen_importlib_external"]
    spec = bootstrap.spec_from_loader(
        "_lucid_assign_run", external.SourceFileLoader("_lucid_assign_run", os.path.join(SITE, "sitecustomize.py")))
    hook = bootstrap.module_from_spec(spec)
    spec.loader.exec_module(hook)
    sys.modules[hook.__name__] = hook
    hook._install()
    for name in [n for n in sys.modules if n == "lucid_assign" or n.startswith("lucid_assign.")]:
        del sys.modules[name]
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=sys.modules["builtins"], __loader__=bootstrap.BuiltinImporter)
    if "__annotations__" in sys.modules["__main__"].__dict__:
        main.__annotations__ = {}
    if how == "script":
        path = os.path.abspath(what)
        main.__file__, main.__cached__ = path, None
        main.__loader__ = external.SourceFileLoader("__main__", path)
        first, argv = os.path.dirname(os.path.realpath(path)), [what, *arguments]
    else:
        first, argv = ("" if how == "-c" else os.getcwd()), [how, *arguments]
    if not (sys.flags.isolated or getattr(sys.flags, "safe_path", False)):
        sys.path[0:1] = [first]
    sys.argv[:] = argv
    sys.modules["__main__"] = main
    sys.excepthook = _from_command(sys.excepthook)
    if how == "-m":
        import runpy

        runpy._run_module_as_main(what, alter_argv=True)
    else:
        if how == "script":
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
        else:
            code = compile(what, "<string>", "exec", dont_inherit=True)
        exec(code, main.__dict__)
    return 0


def _from_command(inner):
    """sys.excepthook that shows an uncaught exception's traceback from COMMAND's code on, as COMMAND's own Python
    would (the launcher's frames left out)."""

    def hook(kind, value, tb):
        start = tb
        while start is not None and start.tb_frame.f_code is not _run_here.__code__:
            start = start.tb_next
        if start is not None:
            tb = start.tb_next
            if isinstance(value, BaseException):  # the printer reads the exception's own traceback
                value.__traceback__ = tb
        inner(kind, value, tb)

    return hook


def launching() -> bool:
    """Whether this process was started as ``lucid-assign run ...`` or ``python -m lucid_assign run ...``."""
    argv = sys.argv
    if len(argv) < 2 or argv[1] != "run":
        return False
    if os.path.basename(argv[0]) in ("lucid-assign", "lucid-assign.exe"):
        return True
    orig = getattr(sys, "orig_argv", [])
    return any(orig[k:k + 2] == ["-m", "lucid_assign"] and orig[k + 2:] == argv[1:] for k in range(len(orig)))


def launch() -> int:
    """The launcher's work, in the process ``launching()`` found: COMMAND, here or in place of this process."""
    return main(sys.argv[2:], here=True)

