"""The sdist and the wheel, built from a clean copy of the repository and installed into fresh virtual environments
(no source tree on sys.path), as a user gets them. Slow (a compile per build and a torch per environment), so these
run only with LUCID_TEST_PACKAGING=1 (CI sets it); they need pip to reach the package index (or its cache).

- the sdist holds every C++/CUDA source and header and every module, whatever machine built it (it is built in an
  isolated environment without torch);
- the wheel (scripts/build_wheel.sh, against the torch running these tests) says what it was built for in its
  version, has auditwheel's manylinux tag without torch's libraries inside, holds every subpackage and the compiled
  library, and, installed from the find-links page (scripts/wheel_index.py) with its torch into a fresh environment,
  is the wheel pip takes, passes `lucid-assign doctor`, imports the integration and trains one patched step with the
  kernel;
- from the same page, into a fresh environment that has another torch (2.13.0, CPU), for which it holds no wheel,
  pip takes the sdist and builds it against that torch; the wheel built for this torch, forced into that environment,
  is reported at import with the reason and the fix, and doctor shows both.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest
import torch

pytestmark = pytest.mark.packaging
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OTHER_TORCH = "torch==2.13.0"  # a CPU build that lies on the development machines' disk (README: tested versions)


def run(cmd, cwd, env=None, timeout=1800):
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


def clean_env(**extra):
    """The environment without this checkout's virtual environment and paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


@pytest.fixture
def fresh_venv(tmp_path):
    """make(*requirements) -> the python of a new virtual environment under tmp_path with those requirements. The
    environment (a torch with its CUDA libraries is several GB) is removed when the test ends, passed or failed, so
    that the tests after it do not run short of disk."""
    path = tmp_path / "venv"

    def make(*requirements):
        run([sys.executable, "-m", "venv", str(path)], cwd=tmp_path)
        python = str(path / "bin" / "python")
        if requirements:
            run([python, "-m", "pip", "install", "-q", "--no-cache-dir", *requirements], cwd=tmp_path,
                env=clean_env())
        return python

    yield make
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A clean copy of the repository: the files git tracks (or, outside a checkout, the tree without build
    outputs), as a fresh clone would have them."""
    dst = tmp_path_factory.mktemp("src") / "lucid-assign"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            if os.path.isfile(os.path.join(ROOT, name)):
                os.makedirs(os.path.dirname(dst / name), exist_ok=True)
                shutil.copy2(os.path.join(ROOT, name), dst / name)
    else:
        shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(".venv", "build", "dist", "*.so", "__pycache__",
                                                                  "_build_info.py", "*.egg-info"))
    return dst


@pytest.fixture(scope="module")
def dist(source):
    """scripts/build_wheel.sh in the clean copy, against the torch running the tests: (sdist, wheel)."""
    env = clean_env(PYTHON=sys.executable, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    if os.environ.get("FORCE_CUDA") == "1":  # CI's build: one architecture and its PTX keep the compile short
        env["TORCH_CUDA_ARCH_LIST"] = os.environ.get("LUCID_WHEEL_ARCH_LIST", "9.0+PTX")
    run(["bash", "scripts/build_wheel.sh", "dist"], cwd=source, env=env)
    (sdist,) = glob.glob(str(source / "dist" / "*.tar.gz"))
    (wheel,) = glob.glob(str(source / "dist" / "*.whl"))
    return sdist, wheel


def _built_with_cuda():
    return os.environ.get("FORCE_CUDA") == "1" or (torch.cuda.is_available() and os.environ.get("FORCE_CUDA") != "0")


def test_sdist_holds_every_source(source, dist):
    sdist, _ = dist
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = set()
    for top in ("csrc", "lucid_assign"):
        for folder, _, files in os.walk(source / top):
            for f in files:
                if f.endswith((".h", ".cuh", ".cpp", ".cu", ".py")) and f != "_build_info.py":
                    wanted.add(os.path.relpath(os.path.join(folder, f), source))
    assert any(n.endswith(".cu") for n in wanted) and any(n.endswith(".h") for n in wanted)
    assert wanted - names == set(), f"missing from the sdist: {sorted(wanted - names)}"
    for must in ("setup.py", "pyproject.toml", "MANIFEST.in", "CMakeLists.txt", "LICENSE", "README.md"):
        assert must in names
    assert not any(n.endswith((".so", "_build_info.py")) for n in names)


def test_wheel_names_what_it_was_built_for(dist):
    _, wheel = dist
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    tag = f"pt{major}{minor}" + ("cu" + torch.version.cuda.replace(".", "") if _built_with_cuda() else "cpu")
    name = os.path.basename(wheel)
    assert name.startswith("lucid_assign-0.2.0+" + tag + "-"), name
    assert re.search(r"-cp310-abi3-manylinux_2_\d+_x86_64\.whl$", name), name
    files = set(zipfile.ZipFile(wheel).namelist())
    grafted = [f for f in files if ".libs/" in f]
    assert not any(lib in f for f in grafted for lib in ("libtorch", "libc10", "libgomp", "libcudart")), grafted
    for must in ("lucid_assign/_C.abi3.so", "lucid_assign/_build_info.py", "lucid_assign/integrations/__init__.py",
                 "lucid_assign/integrations/ultralytics.py", "lucid_assign/api.py", "lucid_assign/reference.py",
                 "lucid_assign/_site/sitecustomize.py"):
        assert must in files, must
    meta = zipfile.ZipFile(wheel).read(next(f for f in files if f.endswith("METADATA"))).decode()
    assert f"Requires-Dist: torch<{major}.{int(minor) + 1},>={major}.{minor}" in meta


TRAIN_STEP = """
import os, sys, torch
import lucid_assign
assert os.path.realpath(lucid_assign.__file__).startswith(os.path.realpath(sys.prefix)), lucid_assign.__file__
from lucid_assign.integrations import ultralytics as lu
from lucid_assign.synthetic import dota_like_batch
lu.patch("kernel")
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import OBBModel
from ultralytics.utils import DEFAULT_CFG
torch.manual_seed(0)
model = OBBModel("yolo26n-obb.yaml", nc=3, verbose=False)
model.args = get_cfg(DEFAULT_CFG)
s = dota_like_batch(batch=2, img_size=64, num_classes=3, objects=(2, 5), obb=True, seed=1)
mask = s["mask_gt"][..., 0].bool()
boxes = s["gt_bboxes"][mask].clone()
boxes[:, :4] /= 64
batch = {"img": torch.rand(2, 3, 64, 64), "cls": s["gt_labels"][mask],
         "batch_idx": torch.arange(2)[:, None].expand_as(mask)[mask].float(), "bboxes": boxes.clamp(0, 1)}
loss, _ = model.loss(batch)
loss.sum().backward()
crit = model.criterion
print("ASSIGNERS", sorted({type(p.assigner).__name__ for p in (crit.one2many, crit.one2one)}), float(loss.sum()))
"""


def _from_page(python, page, torch_version, cwd, *more, env=None):
    """pip install lucid-assign from the find-links page, with the environment's torch pinned (README); returns the
    version pip installed."""
    run([python, "-m", "pip", "install", "-q", "--no-cache-dir", "lucid-assign", f"torch=={torch_version}",
         "--find-links", str(page / "index.html"), *more], cwd=cwd, env=env or clean_env())
    return run([python, "-c", "import importlib.metadata as m; print(m.version('lucid-assign'))"], cwd=cwd,
               env=clean_env()).stdout.strip()


@pytest.fixture
def page(dist, tmp_path):
    """The find-links page of dist's wheel and sdist (scripts/wheel_index.py), in tmp_path/page."""
    folder = tmp_path / "page"
    folder.mkdir()
    for f in dist:
        shutil.copy2(f, folder)
    run([sys.executable, os.path.join(ROOT, "scripts", "wheel_index.py"), str(folder)], cwd=tmp_path)
    return folder


def test_wheel_in_a_fresh_environment(dist, page, fresh_venv, tmp_path):
    """The wheel with its torch (and the peer, to train a step) in a fresh environment, run outside any source tree:
    installed from the find-links page, it is the wheel pip takes."""
    _, wheel = dist
    version = torch.__version__.split("+")[0]
    python = fresh_venv(f"torch=={version}")
    got = _from_page(python, page, version, tmp_path, "ultralytics==8.4.190", "cloudpickle>=3.1.1")
    assert got == os.path.basename(wheel).split("-")[1], (got, wheel)
    doctor = run([str(tmp_path / "venv" / "bin" / "lucid-assign"), "doctor"], cwd=tmp_path, env=clean_env()).stdout
    assert "compiled library: loaded (lucid_assign._C)" in doctor and "all checks passed" in doctor, doctor
    assert f"built with torch {torch.__version__}" in doctor, doctor
    cuda_ops = next(ln for ln in doctor.splitlines() if ln.startswith("ops with a CUDA kernel"))
    assert ("assign" in cuda_ops) == _built_with_cuda(), cuda_ops
    step = run([python, "-c", TRAIN_STEP], cwd=tmp_path, env=clean_env(LUCID_ASSIGN_VERBOSE="1")).stdout
    assert "ASSIGNERS ['LucidRotatedTaskAlignedAssigner']" in step, step
    # the installed console script's `run`: the peer patched in the command's process at its import
    code = "import ultralytics; from lucid_assign.integrations import ultralytics as u; print('RUN', u.is_patched())"
    ran = run([str(tmp_path / "venv" / "bin" / "lucid-assign"), "run", "--trainers", "ultralytics", "--", python, "-c",
               code], cwd=tmp_path, env=clean_env()).stdout
    assert "RUN True" in ran, ran


def test_sdist_builds_against_the_torch_of_the_environment(dist, page, fresh_venv, tmp_path):
    """From the page, into an environment with a torch it has no wheel for, pip takes the sdist and builds it (build
    isolation on) against that torch; the wheel built for the tests' torch, forced into it, is refused at import with
    the reason and the fix."""
    sdist, wheel = dist
    python = fresh_venv(OTHER_TORCH)
    other = run([python, "-c", "import torch; print(torch.__version__)"], cwd=tmp_path, env=clean_env()).stdout.strip()
    got = _from_page(python, page, other.split("+")[0], tmp_path,
                     env=clean_env(FORCE_CUDA="0", MAX_JOBS=os.environ.get("MAX_JOBS", "2")))
    assert got == os.path.basename(sdist)[len("lucid_assign-"):-len(".tar.gz")], got
    doctor = run([python, "-m", "lucid_assign", "doctor"], cwd=tmp_path, env=clean_env()).stdout
    assert f"built with torch {other}" in doctor and "compiled library: loaded" in doctor, doctor
    assert "all checks passed" in doctor, doctor

    run([python, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-deps", "--force-reinstall", wheel],
        cwd=tmp_path, env=clean_env())
    imported = subprocess.run([python, "-c", "import lucid_assign; print(lucid_assign.backends()['library'])"],
                              cwd=tmp_path, env=clean_env(), capture_output=True, text=True)
    assert imported.returncode == 0 and imported.stdout.strip() == "False", imported.stderr
    assert f"was built for torch {torch.__version__}, but torch {other} is running" in imported.stderr
    assert "Fix: rebuild it against the torch you run" in imported.stderr
    doctor = subprocess.run([python, "-m", "lucid_assign", "doctor"], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True).stdout
    assert "compiled library: NOT loaded: lucid_assign._C was built for torch" in doctor, doctor
    assert "  fix: rebuild it against the torch you run" in doctor, doctor
