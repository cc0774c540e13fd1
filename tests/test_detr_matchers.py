"""Any DETR-style matcher patched (lucid_assign.integrations.detr) and ``lucid-assign run``: the matchers of
tests/detr_matchers.py, written here in the pattern many DETR repositories share, each patched and compared call by
call with itself unpatched (SciPy's own solves) on the same inputs: the same result (types, dtypes, devices, values)
or the same exception, with the op doing the solves (counted) and SciPy only in the fall-backs said once."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import warnings

import pytest
import torch

pytest.importorskip("scipy")
import detr_matchers as dm  # noqa: E402

from lucid_assign import FallbackWarning  # noqa: E402
from lucid_assign.integrations import detr  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = {  # objects per image, and how the batch is drawn
    "ragged": ([3, 0, 5, 1], {}),
    "more objects than queries": ([20, 2], {}),
    "no objects": ([0, 0], {}),
    "one image": ([4], {}),
    "one image with none": ([0], {}),
    "ties": ([3, 0, 5, 1], {"ties": True}),
    "nan": ([3, 2], {"bad": "nan"}),
}


@pytest.fixture
def counted():
    """The op's solves and SciPy's while the test runs."""
    with dm.counting() as counts:
        yield counts
    detr.unpatch()


def _outcome(call):
    try:
        return call()
    except Exception as e:  # the same exception, patched and not
        return type(e), str(e)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
                and torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _compare(cls, counts, device, backend="auto", dtype=torch.float32, autocast=False, **kw):
    m = cls(**kw)
    outputs, targets = dm.batch(counts[0], device=device, dtype=dtype, seed=len(counts[0]), **counts[1])
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
        theirs = _outcome(lambda: m(outputs, targets))
        with detr.patched(cls, backend):
            ours = _outcome(lambda: m(outputs, targets))
    assert not detr.is_patched(cls)
    return ours, theirs


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(dm.MATCHERS))
def test_each_matcher_patched_gives_its_own_result(library, counted, name, case, device):
    """Every call of every pattern (softmax and focal costs, the one-to-many rounds, groups of queries, a copy per
    image with maximize) the same as unpatched, the solves the op's: SciPy only for the problem it refuses (NaN),
    where it raises its own error."""
    ours, theirs = _compare(dm.MATCHERS[name], CASES[case], device)
    assert _same(ours, theirs), (ours, theirs)
    if case == "nan":
        assert ours[0] is ValueError and counted["scipy"] == 1
    else:
        assert counted["scipy"] == 0
        assert counted["op"] >= 1 or not any(CASES[case][0])


@pytest.mark.parametrize("name", ["softmax", "one-to-many", "grouped"])
def test_one_op_call_per_split(library, counted, name):
    """The images of one split are solved together: one op call a forward (a round, a group), however many images."""
    m = dm.MATCHERS[name]()
    outputs, targets = dm.batch([4, 1, 7, 2, 5, 3], queries=12)
    with detr.patched(type(m)):
        m(outputs, targets)
    assert counted["op"] == {"softmax": 1, "one-to-many": 3, "grouped": 3}[name]


class HalfCost(dm.SoftmaxMatcher):
    def cost(self, outputs, targets):
        return super().cost(outputs, targets).half()


@pytest.mark.parametrize("cls, dtype", [(dm.SoftmaxMatcher, torch.float64), (HalfCost, torch.float32)])
def test_other_dtypes(library, counted, cls, dtype):
    """float64 and float16 costs (SciPy widens them): the same matches, on the op."""
    ours, theirs = _compare(cls, CASES["ragged"], "cpu", dtype=dtype)
    assert _same(ours, theirs) and counted["op"] == 1 and counted["scipy"] == 0


class BFloat16Cost(dm.SoftmaxMatcher):
    def cost(self, outputs, targets):
        return super().cost(outputs, targets).bfloat16()


def test_under_autocast(library, counted):
    ours, theirs = _compare(dm.FocalMatcher, CASES["ragged"], "cpu", autocast=True)
    assert _same(ours, theirs) and counted["op"] == 1 and counted["scipy"] == 0


def test_a_bfloat16_cost_goes_to_scipy(library, counted):
    """A bfloat16 cost, which SciPy cannot read: SciPy itself, which raises as before, said once."""
    with pytest.warns(FallbackWarning, match="bfloat16"):
        ours, theirs = _compare(BFloat16Cost, CASES["ragged"], "cpu")
    assert _same(ours, theirs) and ours[0] is TypeError and counted["op"] == 0


@pytest.mark.parametrize("forbid", [0.3, 0.97])
def test_forbidden_pairs_and_infeasible_costs(library, counted, forbid):
    """+inf forbids a pair; where no complete matching avoids it SciPy raises, here too."""
    ours, theirs = _compare(dm.SoftmaxMatcher, CASES["ragged"], "cpu", forbid=forbid)
    assert _same(ours, theirs), (ours, theirs)
    assert (ours[0] is ValueError) == (forbid > 0.9)


def test_under_inference_mode_the_blocks_go_to_scipy(library, counted):
    """Inference tensors track no version counter, so a change to the copy would go unseen: SciPy itself, said once."""
    m = dm.OneToManyMatcher()
    outputs, targets = dm.batch(CASES["ragged"][0])
    with torch.inference_mode():
        theirs = m(outputs, targets)
        with pytest.warns(FallbackWarning, match="no block of one it copied"), detr.patched(dm.OneToManyMatcher):
            ours = m(outputs, targets)
    assert _same(ours, theirs) and counted["op"] == 0


def test_backend_reference(counted):
    ours, theirs = _compare(dm.OneToManyMatcher, CASES["ragged"], "cpu", backend="reference")
    assert _same(ours, theirs) and counted["op"] == 3 and counted["scipy"] == 0


@pytest.mark.parametrize("cls, said", [(dm.NumpyMatcher, "handed SciPy a ndarray"),
                                       (dm.ModuleAttributeMatcher, "called no linear_sum_assignment")])
def test_unrecognised_calls_go_to_scipy_said_once(library, counted, cls, said):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ours, theirs = _compare(cls, CASES["ragged"], "cpu")
            assert _same(ours, theirs)
    messages = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(messages) == 1 and said in messages[0], messages
    assert counted["op"] == 0


def test_patch_by_name_unpatch_and_report(library):
    """By "module:Class"; unpatch() restores the forward and SciPy's function under the module's name; patch() is
    idempotent; an inherited forward (FocalMatcher's) is inherited again after."""
    from scipy.optimize import linear_sum_assignment

    own = dm.SoftmaxMatcher.forward
    detr.patch("detr_matchers:SoftmaxMatcher")
    detr.patch(dm.SoftmaxMatcher)
    detr.patch("detr_matchers:FocalMatcher", "reference")
    try:
        assert detr.is_patched() and detr.is_patched("detr_matchers:FocalMatcher")
        assert dm.linear_sum_assignment is not linear_sum_assignment
        assert dm.linear_sum_assignment.__wrapped__ is linear_sum_assignment
        assert "forward" in vars(dm.FocalMatcher) and dm.SoftmaxMatcher.forward is not own
        assert any(line.startswith("detr_matchers:SoftmaxMatcher: patched") for line in detr.patch_report())
        detr.unpatch(dm.SoftmaxMatcher)
        assert dm.SoftmaxMatcher.forward is own and dm.linear_sum_assignment is not linear_sum_assignment
    finally:
        detr.unpatch()
    assert dm.linear_sum_assignment is linear_sum_assignment and "forward" not in vars(dm.FocalMatcher)
    assert not detr.is_patched()


@pytest.mark.parametrize("matcher, error, words", [
    ("detr_matchers", ValueError, "'module:Class'"),
    ("no_such_module_here:Matcher", ImportError, "cannot import 'no_such_module_here'"),
    ("detr_matchers:NoSuchMatcher", AttributeError, "has no attribute 'NoSuchMatcher'"),
    ("detr_matchers:batch", TypeError, "not a class with a forward"),
    (3, TypeError, "a class or 'module:Class'"),
])
def test_bad_matchers_name_the_argument(matcher, error, words):
    with pytest.raises(error, match="matcher") as e:
        detr.patch(matcher)
    assert words in str(e.value)
    with pytest.raises(ValueError, match="backend"):
        detr.patch(dm.SoftmaxMatcher, "fast")
    assert not detr.is_patched()


def test_outside_a_patched_call_the_name_is_scipy(library, counted):
    """The module's name answers SciPy's own outside a patched forward, and in another thread during one."""
    cost = torch.rand(6, 4)
    seen = {}
    m = dm.SoftmaxMatcher()
    outputs, targets = dm.batch([3, 2])

    def other():
        seen["other"] = dm.linear_sum_assignment(cost)

    class Threaded(dm.SoftmaxMatcher):
        def cost(self, outputs, targets):
            worker = threading.Thread(target=other)
            worker.start()
            worker.join()
            return super().cost(outputs, targets)

    with detr.patched(dm.SoftmaxMatcher):
        direct = dm.linear_sum_assignment(cost)
        Threaded()(outputs, targets)
        m(outputs, targets)
    from scipy.optimize import linear_sum_assignment

    want = linear_sum_assignment(cost)
    for got in (direct, seen["other"]):
        assert all((a == b).all() for a, b in zip(got, want))
    assert counted["scipy"] == 2 and counted["op"] == 2


def test_the_results_are_scipys_arrays(library):
    """What SciPy hands the forward: a tuple of two int64 NumPy arrays of their own."""
    seen = []

    class Keeping(dm.SoftmaxMatcher):
        @torch.no_grad()
        def forward(self, outputs, targets):
            c = self.cost(outputs, targets).cpu()
            sizes = [len(t["boxes"]) for t in targets]
            seen.extend(dm.linear_sum_assignment(block[i]) for i, block in enumerate(c.split(sizes, -1)))

    outputs, targets = dm.batch([3, 0, 2])
    Keeping()(outputs, targets)
    theirs, seen[:] = list(seen), []
    with detr.patched(Keeping):
        Keeping()(outputs, targets)
    for ours, want in zip(seen, theirs):
        assert type(ours) is tuple and len(ours) == 2
        for a, b in zip(ours, want):
            assert type(a) is type(b) and a.dtype == b.dtype and a.flags.owndata and (a == b).all()


# --- lucid-assign run --------------------------------------------------------------------------------------------


def _python(args):
    """A Python process in the tests' folder (the matchers import by name)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    env.pop("MASTER_PORT", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=HERE, env=env, timeout=300)


def _run(args):
    """``lucid-assign run ARGS`` as a user types it (python -m lucid_assign: the console script's equal)."""
    return _python(["-m", "lucid_assign", "run", *args])


def _reports(out) -> list:
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


MATCHER_ARGS = ["--matcher", "detr_matchers:SoftmaxMatcher", "--matcher", "detr_matchers:OneToManyMatcher"]


def test_run_patches_the_matchers_of_a_script(library):
    (found,) = _reports(_run([*MATCHER_ARGS, "--trainers", "none", "--", sys.executable, "detr_run.py", "softmax",
                              "one-to-many"]))
    assert found["patched"] == {"softmax": True, "one-to-many": True}
    assert found["same"] and found["scipy_calls"] == 0 and found["op_calls"] >= found["calls"] - 2, found


def test_run_patches_every_rank(library):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _run([*MATCHER_ARGS, "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(port), "detr_run.py", "softmax", "one-to-many"])
    found = _reports(out)
    assert sorted(f["rank"] for f in found) == [0, 1], out.stdout
    assert all(f["patched"] == {"softmax": True, "one-to-many": True} and f["same"] and f["scipy_calls"] == 0
               for f in found), found


def test_run_patches_a_spawned_worker(library):
    (found,) = _reports(_run([*MATCHER_ARGS, "--", sys.executable, "detr_run.py", "--spawn", "softmax"]))
    assert found["pid"] != found["parent_pid"]
    assert found["patched"] == {"softmax": True} and found["same"] and found["scipy_calls"] == 0, found


def test_without_run_nothing_is_patched(library):
    (found,) = _reports(_python(["detr_run.py", "softmax"]))
    assert found["patched"] == {"softmax": False} and found["op_calls"] == 0 and found["scipy_calls"] == 0


def test_a_process_that_imports_no_trainer_is_unchanged():
    """Its modules (but the hook's, and those of the launch: ``python -m`` imports runpy) and sys.path are those of
    the same command without run, whether it runs in the launcher's process (this Python) or replaces it (an
    interpreter option)."""
    code = "import json, sys; print(json.dumps([sorted(sys.modules), sys.path, sys.meta_path[0].__module__]))"
    launch = set(json.loads(_python(["-c", "import runpy, sys, json; print(json.dumps(sorted(sys.modules)))"]).stdout))
    for option in ([], ["-B"]):
        modules, path, _ = json.loads(_python([*option, "-c", code]).stdout)
        (ran, ran_path, first) = json.loads(_run(["--", sys.executable, *option, "-c", code]).stdout)
        extra = set(ran) - set(modules) - launch
        assert extra <= {"sitecustomize", "_lucid_assign_run", "importlib.machinery", "importlib"}, extra
        assert set(modules) <= set(ran) and ran_path == path
        assert first == ("sitecustomize" if option else "_lucid_assign_run")
        assert not any(m.split(".")[0] in ("torch", "lucid_assign") for m in ran)


# what a command sees of its start: argv, sys.path[0], __main__'s file, spec name and loader kind, and the process's
# own argv (the launcher's where the command ran in its process)
SEEN = ("import json, sys; m = sys.modules['__main__']; print(json.dumps([sys.argv, sys.path[0], "
        "getattr(m, '__file__', None), getattr(m.__spec__, 'name', None), type(m.__loader__).__name__, "
        "sys.orig_argv]))")


def test_this_python_runs_a_script_a_module_or_code_in_the_launchers_process_as_it_would_alone(tmp_path):
    """``python SCRIPT``, ``python -m MODULE`` and ``python -c CODE`` of the launcher's own Python run in its process
    (no second interpreter start), and see what they would see in a process of their own: sys.argv, sys.path[0] (the
    script's real folder; the working directory; ''), a fresh ``__main__`` (its file, spec and loader), the same
    sys.path; the package imports afresh and whole there. A Python with an option, or another command, replaces the
    launcher (its own argv)."""
    code = SEEN
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "seen.py").write_text(code + "\n")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "script.py").write_text(
        code + "\nimport lucid_assign; print(hasattr(lucid_assign, 'assign'))\n")
    os.symlink(tmp_path / "real" / "script.py", tmp_path / "link.py")
    cases = [([str(tmp_path / "link.py"), "a"], True), (["-m", "pkg.seen", "b"], True), (["-c", code, "c"], True),
             (["-B", "-c", code, "c"], False)]
    for args, here in cases:
        alone = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        ran = subprocess.run([sys.executable, "-m", "lucid_assign", "run", "--", sys.executable, *args],
                             capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert alone.returncode == 0 and ran.returncode == 0, ran.stderr[-2000:]
        assert ran.stdout.splitlines()[1:] == alone.stdout.splitlines()[1:]  # the package, whole
        mine, theirs = json.loads(ran.stdout.splitlines()[0]), json.loads(alone.stdout.splitlines()[0])
        assert mine[:5] == theirs[:5], (args, mine, theirs)
        assert (mine[5] != theirs[5]) == here and ("lucid_assign" in mine[5]) == here


def test_a_command_run_in_the_launchers_process_fails_and_is_interrupted_as_alone():
    """An uncaught exception: the traceback from the command's code on (no frame of the launcher), status 1; an
    interrupt ends the process by SIGINT, as Python does; a thread of the command may import the package while
    the main thread waits for it (the launcher holds no import lock)."""
    failing = "def f():\n    1 / 0\nf()"
    for args in (["-c", failing], ["-c", "raise KeyboardInterrupt"]):
        alone = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
        ran = _run(["--", sys.executable, *args])
        assert ran.returncode == alone.returncode != 0 and ran.stderr == alone.stderr, ran.stderr
    threaded = ("import threading; t = threading.Thread(target=__import__, args=('lucid_assign.integrations.detr',)); "
                "t.start(); t.join(120); print(t.is_alive())")
    assert _run(["--", sys.executable, "-c", threaded]).stdout.split() == ["False"]


def test_the_console_script_runs_this_python_in_its_process():
    """The installed ``lucid-assign`` (lucid_assign._console:console) launches before the package loads torch."""
    script = os.path.join(os.path.dirname(sys.executable), "lucid-assign")
    if not os.path.exists(script):
        pytest.skip("no lucid-assign console script beside this Python")
    code = "import sys, json; print(json.dumps([sys.orig_argv[1:3], 'torch' in sys.modules]))"
    out = subprocess.run([script, "run", "--", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and json.loads(out.stdout) == [[script, "run"], False], out.stderr


def test_a_sitecustomize_run_shadows_still_runs(tmp_path):
    """An environment's own sitecustomize (here one on PYTHONPATH) runs under run as without it."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nMARK = 'theirs'\nsys.flags_seen = True\n")
    code = "import sys, sitecustomize; print(sitecustomize.MARK, getattr(sys, 'flags_seen', False))"
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "lucid_assign", "run", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, cwd=HERE, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["theirs", "True"], out.stderr


def test_run_passes_the_exit_status_and_signals_through():
    for option in ([], ["-B"]):  # in the launcher's process, and in its place
        assert _run(["--", sys.executable, *option, "-c", "raise SystemExit(7)"]).returncode == 7
        killed = _run(["--", sys.executable, *option, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
        assert killed.returncode == -signal.SIGTERM
    missing = _run(["--", "no-such-command-here"])
    assert missing.returncode == 127 and "no-such-command-here" in missing.stderr


@pytest.mark.parametrize("args, words", [
    ([], "no COMMAND"),
    (["--backend", "fast", "--"], "--backend: invalid choice 'fast'"),
    (["--trainers", "ultralytics,yolox", "--"], "--trainers: unknown 'yolox'"),
    (["--matcher", "models.matcher", "--"], "--matcher: 'models.matcher' is not MODULE:CLASS"),
    (["--matcher"], "--matcher needs a value"),
    (["--fast", "--"], "unrecognized option '--fast'"),
])
def test_run_refuses_bad_arguments_before_anything_runs(tmp_path, args, words):
    marker = tmp_path / "ran"
    out = _run([*args, sys.executable, "-c", f"open({str(marker)!r}, 'w')"] if args[-1:] == ["--"] else args)
    assert out.returncode == 2 and not marker.exists()
    assert out.stderr.strip().splitlines()[-1].startswith(f"lucid-assign run: error: {words}"), out.stderr


@pytest.mark.peer
def test_run_patches_each_trainer_at_its_import_and_only_those_named(library, peer_tal):
    pytest.importorskip("transformers")
    code = ("import ultralytics, json; from lucid_assign.integrations import ultralytics as u, transformers as t; "
            "print(json.dumps([u.is_patched(), t.is_patched()]))")
    assert json.loads(_run(["--trainers", "ultralytics", "--", sys.executable, "-c", code]).stdout) == [True, False]
    assert json.loads(_run(["--trainers", "transformers", "--", sys.executable, "-c", code]).stdout) == [False, False]
    code = ("import transformers.loss.loss_for_object_detection, json; "
            "from lucid_assign.integrations import transformers as t; print(json.dumps(t.is_patched()))")
    assert json.loads(_run(["--trainers", "transformers", "--", sys.executable, "-c", code]).stdout) is True


def test_the_cli_starts_without_dynamo_or_a_trainer():
    """--version and --help import neither torch._dynamo (0.8 s on a 2-core machine) nor any trainer."""
    code = ("import sys\nfrom lucid_assign.__main__ import main\nfor argv in (['--version'], ['--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m == 'torch._dynamo' or m.split('.')[0] in "
            "('ultralytics', 'transformers', 'rfdetr', 'scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


@pytest.mark.cuda
def test_the_forward_gets_its_copy_in_page_locked_memory(library):
    """On CUDA, the patched forward's .cpu() copy is made into page-locked memory (detr.PAGE_LOCKED, on by default):
    the same values, dtype, shape and strides as torch's .cpu(); the matches the same."""
    assert detr.PAGE_LOCKED
    seen = []

    class Seeing(dm.SoftmaxMatcher):
        def forward(self, outputs, targets):
            cost = self.cost(outputs, targets)
            seen.append((cost, cost.cpu(), cost[:, :, 1:].cpu()))
            return super().forward(outputs, targets)

    outputs, targets = dm.batch([3, 2], device="cuda")
    theirs = Seeing()(outputs, targets)
    seen.clear()
    with detr.patched(Seeing):
        assert _same(Seeing()(outputs, targets), theirs)
    for cost, host, strided in seen:
        for device_tensor, copy in ((cost, host), (cost[:, :, 1:], strided)):
            want = torch._C.TensorBase.cpu(device_tensor)
            assert copy.is_pinned() and copy.dtype == want.dtype and copy.stride() == want.stride()
            assert torch.equal(copy, want)
