import os

os.environ.setdefault("YOLO_OFFLINE", "1")  # the peer must not look for the network (here and in subprocesses)

import pytest  # noqa: E402
import torch  # noqa: E402

import lucid_assign  # noqa: E402
from lucid_assign import _library  # noqa: E402

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Skip `cuda` tests without a GPU, and `packaging` tests unless LUCID_TEST_PACKAGING=1. CI sets
    LUCID_REQUIRE_EXT=1 so that a library that failed to load fails the run instead of skipping the op tests,
    LUCID_REQUIRE_PEER=1 for the peer oracle, and LUCID_TEST_PACKAGING=1."""
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_packaging = pytest.mark.skip(reason="builds and installs the sdist and a wheel: set LUCID_TEST_PACKAGING=1")
    for item in items:
        if "cuda" in item.keywords and not HAS_GPU:
            item.add_marker(skip_cuda)
        if "packaging" in item.keywords and os.environ.get("LUCID_TEST_PACKAGING") != "1":
            item.add_marker(skip_packaging)


@pytest.fixture(autouse=True)
def _default_float_mode():
    """Each test ends with subnormals kept: older Inductors (torch 2.4) build their CPU kernels with -ffast-math, and
    loading one sets flush-to-zero in the thread that loads it, which would then round that thread's work, and not the
    other threads', differently in the tests after it."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def library():
    """The compiled library; skipped (or failed, with LUCID_REQUIRE_EXT=1) when it is not loaded."""
    if not _library.loaded():
        msg = f"compiled library not loaded: {_library.LOAD_ERROR}"
        if os.environ.get("LUCID_REQUIRE_EXT") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return lucid_assign.ops


@pytest.fixture(scope="session")
def peer_tal():
    """The peer's assigner module (ultralytics.utils.tal), the oracle of the reference."""
    try:
        from ultralytics.utils import tal
    except ImportError as exc:
        if os.environ.get("LUCID_REQUIRE_PEER") == "1":
            pytest.fail(f"ultralytics is required here: {exc}")
        pytest.skip(f"ultralytics not installed: {exc}")
    return tal


def devices():
    """CPU always; CUDA as a `cuda`-marked parameter."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def one_ulp_off(real, on: bool):
    """A stand-in for a cost op returning (cost, invalid): real's, with the first entry of the cost one unit in the
    last place higher where ``on`` (for the tests that a patched matcher's guard fails at one ulp)."""
    def op(*args, **kwargs):
        cost, invalid = real(*args, **kwargs)
        if on:
            cost = cost.clone()
            cost[0, 0, 0] = torch.nextafter(cost[0, 0, 0], torch.tensor(float("inf")))
        return cost, invalid
    return op
