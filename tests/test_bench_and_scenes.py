"""The synthetic scenes, the `lucid-assign bench` command and the demo."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from lucid_assign import __main__ as cli
from lucid_assign import reference
from lucid_assign.synthetic import anchor_points, dota_like_batch

from contract import assert_matches

KEYS = reference.INPUTS


def test_scene_is_seeded_and_reproducible():
    a, b, c = (dota_like_batch(batch=2, img_size=256, objects=(5, 40), seed=s) for s in (3, 3, 4))
    assert all(torch.equal(a[k], b[k]) for k in KEYS)
    assert not torch.equal(a["gt_bboxes"], c["gt_bboxes"])


@pytest.mark.parametrize("obb", [False, True])
def test_scene_without_predictions_has_the_same_objects(obb):
    """predictions=False (what write_yolo_dataset takes) draws what the predictions draw, so every image's objects are
    those of the full scene (image 1 on follows image 0's draws), and an image without objects too."""
    for kw in (dict(objects=(0, 30)), dict(counts=[5, 0, 40]), dict(dense_sizes=(4.0, 20.0), counts=[60, 3, 0])):
        full = dota_like_batch(batch=3, img_size=128, num_classes=5, obb=obb, seed=7, **kw)
        bare = dota_like_batch(batch=3, img_size=128, num_classes=5, obb=obb, seed=7, predictions=False, **kw)
        assert bare["pd_scores"] is None and bare["pd_bboxes"] is None
        assert all(torch.equal(full[k], bare[k]) for k in ("gt_bboxes", "gt_labels", "mask_gt", "anc_points"))


@pytest.mark.parametrize("obb", [False, True])
def test_scene_shapes_and_padding(obb):
    s = dota_like_batch(batch=3, img_size=256, num_classes=5, objects=(4, 30), obb=obb, seed=1)
    n = s["num_objects"]
    m = max(n)
    d = 5 if obb else 4
    assert s["gt_bboxes"].shape == (3, m, d) and s["pd_bboxes"].shape == (3, anchor_points(256).shape[0], d)
    assert s["pd_scores"].shape[-1] == 5 and ((s["pd_scores"] >= 0) & (s["pd_scores"] <= 1)).all()
    for b, count in enumerate(n):
        assert s["mask_gt"][b, :count].all() and not s["mask_gt"][b, count:].any()
        assert (s["gt_bboxes"][b, count:] == 0).all()
        assert ((s["gt_labels"][b, :count] >= 0) & (s["gt_labels"][b, :count] < 5)).all()


def test_scene_size_spread_and_clusters():
    s = dota_like_batch(batch=4, objects=300, seed=2)
    valid = s["mask_gt"][..., 0].bool()
    sides = s["gt_bboxes"][..., 2:4][valid]
    assert sides.min() < 8 and sides.max() > 200  # a few pixels to several hundred
    assert (sides.min(-1).values < 16).float().mean() > 0.05  # some under the stride floor (16)
    angles = s["gt_bboxes"][..., 4][valid]
    assert angles.abs().max() <= math.pi / 2 + 0.5 and angles.std() > 0.3  # rotated
    # clusters: many objects share an angle exactly (a parking lot), which uniform placement never gives
    _, counts = torch.unique(angles, return_counts=True)
    assert counts.max() >= 8


def test_scene_exercises_the_rare_paths():
    s = dota_like_batch(batch=2, img_size=512, objects=120, seed=5)
    scores, pd, anc, labels, gt, mask = (s[k] for k in KEYS)
    inside = reference.points_in_boxes(anc, gt, mask, 16)
    align, ov = reference.box_metrics(scores, pd, labels, gt, inside & mask.bool(), 0.5, 6.0)
    pos = reference.topk_mask(align, 10) & inside & mask.bool()
    assert (pos.sum(1) > 1).any(), "conflicts"
    tiny = (gt[..., 2:4].min(-1).values < 16) & mask[..., 0].bool()
    assert (pos.any(-1) & tiny).any(), "positives of objects under the stride floor"
    per_object = pos.sum(-1)[mask[..., 0].bool()]
    assert (per_object < 10).any() and (per_object == 10).any(), "top-k limited by the in-box count, and full"


def test_kernel_matches_reference_on_a_realistic_scene(library):
    s = dota_like_batch(batch=2, img_size=512, objects=(30, 150), seed=6)
    inputs = [s[k] for k in KEYS]
    kw = dict(topk=10, num_classes=15, alpha=0.5, beta=6.0, stride=s["stride"])
    want = reference.assign(*inputs, **kw)
    from lucid_assign import api

    got = api.assign(*inputs, backend="kernel", **kw)
    assert_matches(got, want, exact=False)


def test_records_name_the_commit_of_an_archived_tree(tmp_path):
    """A tree made by ``git archive`` (how a tree is carried to another machine) has no .git: its records name the
    archived commit all the same; a checkout's name git's HEAD."""
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    head = subprocess.run(["git", "-C", top, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode or not os.path.exists(os.path.join(top, ".git")):
        pytest.skip("not a git checkout")
    tar = subprocess.run(["git", "-C", top, "archive", "HEAD", "lucid_assign"], capture_output=True,
                         check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=tar, check=True)
    run = [sys.executable, "-c", "from lucid_assign.bench import source_commit; print(source_commit())"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the archive's package, not another
    archived = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert archived == head.stdout.strip()
    from lucid_assign.bench import source_commit

    assert source_commit() in (head.stdout.strip(), None)  # None: the package imported here is an installed one


def test_bench_command_writes_json_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    rc = cli.main(["bench", "--kind", "hbb", "--batch", "1", "--objects", "5", "20", "--reps", "2", "--device",
                   "cpu", "--out", str(out), "--plot", str(png), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "positives per object" in text and "vs reference" in text
    data = json.loads(out.read_text())
    assert {"torch", "cuda", "gpu", "commit", "date"} <= set(data["environment"])
    timed = [r for r in data["results"] if "median_s" in r]
    assert {r["backend"] for r in timed} >= {"reference"}
    assert all(r["min_s"] <= r["median_s"] <= r["max_s"] for r in timed)
    head = png.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    h, w = matplotlib.image.imread(str(png)).shape[:2]
    assert (w, h) == (1210, 462)  # 11 x 4.2 inches at 110 dpi


def test_demo_runs(capsys):
    assert cli.main(["demo", "--batch", "1", "--img-size", "256", "--objects", "5", "20", "--reps", "1",
                     "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "objects left with no positive" in text and "reference assign" in text


def _bench_script(name: str):
    import importlib.util

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    path = os.path.join(folder, f"{name}.py")
    sys.path.insert(0, folder)  # the scripts import their neighbours
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return path, module


def test_lsap_steps_counts_the_searches(capsys):
    """bench/lsap_steps.py: the steps of SciPy's searches, counted by hand on small problems (a search that finds a
    free column at once is one step; an augmenting path through a matched column two), then a tiny model's loss."""
    pytest.importorskip("transformers")
    _, lsap_steps = _bench_script("lsap_steps")
    assert lsap_steps.steps(1 - torch.eye(4, dtype=torch.float64)) == 4  # each row's best column is free
    assert lsap_steps.steps(torch.full((3, 3), 2.0, dtype=torch.float64)) == 3  # ties: a free column at once
    # row 0 takes column 0; row 1 reaches column 0 first (matched), then row 0's way to the free column 1
    assert lsap_steps.steps(torch.tensor([[0.0, 1.0], [0.0, 5.0]], dtype=torch.float64)) == 3
    assert lsap_steps.steps(torch.tensor([[0.0, 1.0], [0.0, 5.0], [9.0, 9.0]], dtype=torch.float64)) == 3  # tall
    lsap_steps.main(["--batch", "1", "--imgsz", "128", "--objects", "3"])  # 128 px: 336 proposals
    out = capsys.readouterr().out
    assert "7 matcher calls" in out and "call 7:" in out


def test_detr_costs_are_seeded_and_look_like_a_trainers():
    """synthetic.detr_costs: one seed, one batch; an untrained model's costs differ little from query to query (near
    ties: a long search, as an untrained RT-DETR's, bench/lsap_steps.py), a partly trained one's have confident
    queries (each object's best cost far below its median) and duplicated rows; bad arguments are named."""
    from lucid_assign.synthetic import detr_costs

    _, lsap_steps = _bench_script("lsap_steps")
    costs = {k: detr_costs(2, 300, 50, k, seed=3) for k in ("uniform", "untrained", "trained")}
    for kind, cost in costs.items():
        assert cost.shape == (2, 300, 50) and cost.dtype == torch.float32 and torch.isfinite(cost).all()
        assert torch.equal(cost, detr_costs(2, 300, 50, kind, seed=3))
        assert not torch.equal(cost, detr_costs(2, 300, 50, kind, seed=4))

    def spread(c):  # each object's spread over the queries, against its mean
        return float((c.std(1) / c.mean(1).abs()).median())

    untrained, trained = costs["untrained"], costs["trained"]
    assert spread(untrained) < spread(trained)
    steps = {k: lsap_steps.steps(c[0].double()) for k, c in costs.items()}
    assert steps["untrained"] > steps["uniform"] and steps["untrained"] > steps["trained"], steps
    gap = trained.median(1).values - trained.min(1).values
    assert bool((gap > untrained.median(1).values - untrained.min(1).values).float().mean() > 0.9)
    for b in range(2):
        same = (trained[b][:, None, :] == trained[b][None, :, :]).all(-1)
        assert int(same.sum()) > 300  # rows equal to another row
    assert detr_costs(1, 300, 0, "untrained").shape == (1, 300, 0) and detr_costs(1, 0, 4, "trained").shape == (1, 0, 4)
    for bad, words in [(dict(kind="tired"), "kind: 'tired'"), (dict(objects=-1), "must be >= 0")]:
        with pytest.raises(ValueError, match=words):
            detr_costs(**bad)


def test_the_lsap_bench_times_each_kind_of_costs_and_the_readme_names_it(tmp_path, capsys, library):
    """lucid-assign bench --kind lsap --costs: a row per shape, kind of costs and backend; scripts/figures.py's row
    names the kind and its command carries --costs."""
    out = tmp_path / "lsap.json"
    assert cli.main(["bench", "--kind", "lsap", "--shapes", "2x20x5", "--costs", "uniform", "untrained", "--device",
                     "cpu", "--reps", "1", "--backends", "kernel,api,scipy", "--no-progress", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert [(r["costs"], r["backend"]) for r in rec["results"]] == [
        (kind, backend) for kind in ("uniform", "untrained") for backend in ("kernel", "api", "scipy")]
    figures = _figures()
    rows = figures._lsap_rows(rec)
    assert len(rows) == 2 and "2 problems of 20 x 5 an untrained DETR's float32 costs" in rows[1]
    api = rec["results"][4]["median_s"]
    assert f"the public function {figures._ms(api)}, synchronised" in rows[1]
    assert "--costs uniform untrained" in figures._command(rec["args"])
    assert "untrained" in capsys.readouterr().out


def test_fit_recipes_object_counts():
    _, fit_time = _bench_script("fit_time")
    counts = fit_time.object_counts(fit_time.RECIPES["dota-obb"].counts, 2001)
    assert counts[0] == 1200 and 1 <= min(counts) and max(counts) <= 1500
    assert 50 <= sorted(counts)[1000] <= 72  # a median near 60 (a log-normal's median is its exp(mu))
    dense = fit_time.object_counts(fit_time.RECIPES["dense-obb"].counts, 50)
    assert min(dense) >= 1000 and max(dense) <= 2000


def test_fit_benchmark_runs_complete_fits_on_the_cpu(tmp_path, library):
    """Complete tiny fits, plain and patched, through the peer's trainer: one pair, then a second by --resume (the
    dataset reused). The record holds each fit's times, shares, every step's loss and the end states' digests; fits
    of one variant end byte for byte the same (the digests are of the state, nothing of the process). Plain against
    patched on the CPU is within the CPU's stated tolerance, not compared here."""
    pytest.importorskip("ultralytics")
    pytest.importorskip("cv2")
    path, fit_time = _bench_script("fit_time")
    out = tmp_path / "fit.json"
    cmd = [sys.executable, path, "--recipe", "dota-obb", "--device", "cpu", "--amp", "false", "--images", "4",
           "--imgsz", "64", "--epochs", "2", "--workers", "0", "--folder", str(tmp_path / "work"), "--out", str(out)]
    runs = [subprocess.run(cmd + extra, capture_output=True, text=True, timeout=900)
            for extra in (["--pairs", "1"], ["--pairs", "2", "--resume", "--max-fits", "1"],
                          ["--pairs", "2", "--resume"])]
    for run in runs:
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "the dataset written" in runs[0].stdout and "the dataset written" not in runs[1].stdout + runs[2].stdout
    assert "2 of 4 fits done" in runs[1].stdout and "3 of 4 fits done: --resume goes on" in runs[1].stdout
    assert "3 of 4 fits done" in runs[2].stdout
    record = json.loads(out.read_text())
    assert [(f["variant"], f["pair"]) for f in record["fits"]] == [("plain", 0), ("patched", 0), ("patched", 1),
                                                                    ("plain", 1)]
    for f in record["fits"]:
        assert len(f["epochs"]) == len(f["loops"]) == len(f["waits"]) == 2 and f["steps"] == 2  # 4 images: a step
        assert set(f["digests"]) == set(fit_time.STATES) and 0 < sum(f["loops"]) < f["fit_s"] < f["wall_s"]
        assert (f["patch_s"] is None) == (f["variant"] == "plain")
    summary = record["summary"]
    patched = [f for f in record["fits"] if f["variant"] == "patched"]
    assert summary["plain_differ"] == [] and fit_time._agree(patched) == []
    assert 0 < summary["patched"]["loop_share"]["median"] < 1 and summary["patched"]["patch_s"]["max"] > 0
    assert "end state" in runs[2].stdout
    assert str(tmp_path) not in out.read_text()  # the record keeps no path of the machine that made it
    other = subprocess.run(cmd + ["--pairs", "2", "--resume", "--epochs", "3"], capture_output=True, text=True,
                           timeout=300)
    assert other.returncode != 0 and "holds fits of other arguments" in other.stderr
    record["environment"]["code"] = "0" * 16  # fits of other code (package sources, extension or this script)
    out.write_text(json.dumps(record))
    other = subprocess.run(cmd + ["--pairs", "3", "--resume"], capture_output=True, text=True, timeout=300)
    assert other.returncode != 0 and "was made with another code" in other.stderr


def test_fit_summary_says_where_the_end_states_differ():
    _, fit_time = _bench_script("fit_time")

    def fit(variant, pair, **digests):
        return dict(variant=variant, pair=pair, wall_s=10.0, fit_s=9.0, epochs=[3.0, 2.0, 2.5], loops=[2.5, 1.7, 2.0],
                    waits=[0.1, 0.0, 0.2], patch_s=0.1 if variant == "patched" else None, final={},
                    digests=dict.fromkeys(fit_time.STATES, "a") | digests)

    same = [fit("plain", 0), fit("patched", 0), fit("patched", 1), fit("plain", 1)]
    result = fit_time.summary(same, "0")
    assert result["identical"] and fit_time.exit_status(result) == 0
    assert result["patched"]["loop_share"]["median"] == pytest.approx(0.62)
    moved = [fit("plain", 0), fit("patched", 0, optimizer="b"), fit("patched", 1, optimizer="b"), fit("plain", 1)]
    result = fit_time.summary(moved, "0")
    assert result["differ"] == ["optimizer"] and result["plain_agree"] and fit_time.exit_status(result) == 1
    assert "DIFFER in optimizer" in fit_time.table(result)
    assert fit_time.exit_status(fit_time.summary(moved, "cpu")) == 0  # the CPU's contract is a tolerance
    noisy = [fit("plain", 0, losses="x"), fit("patched", 0, losses="y"), fit("patched", 1, losses="z"),
             fit("plain", 1, losses="w")]
    result = fit_time.summary(noisy, "0")
    assert result["plain_differ"] == ["losses"] and fit_time.exit_status(result) == 0
    assert "not deterministic here" in fit_time.table(result)


def _figures():
    spec = importlib.util.spec_from_file_location(
        "figures", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "figures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_fit_record_makes_one_readme_row_that_says_how_far_it_got_and_how_the_fits_ended():
    """scripts/figures.py: a record of fit_time.py is one row: the whole process's medians and their ratio, the fit
    and an epoch beside them, the pairs done of those asked, and the end state (identical, differing, or not
    comparable where the plain fits already differ among themselves); a record begun, the fits it holds."""
    _, fit_time = _bench_script("fit_time")
    figures = _figures()

    def fit(variant, pair, wall, **digests):
        return dict(variant=variant, pair=pair, wall_s=wall, fit_s=wall - 1, epochs=[3.0, 2.0, 2.5],
                    loops=[2.5, 1.7, 2.0], waits=[0.1, 0.0, 0.2], patch_s=0.1 if variant == "patched" else None,
                    final={}, digests=dict.fromkeys(fit_time.STATES, "a") | digests)

    args = dict(recipe="rtdetr", model="rtdetr-l.yaml", batch=16, imgsz=640, epochs=10, pairs=3)

    def row(fits):
        (line,) = figures._fit_rows(dict(args=args, counts=[1, 4, 9], fits=fits, summary=fit_time.summary(fits, "0")))
        return line

    begun = row([fit("plain", 0, 20.0)])  # a record begun: the fit it holds, nothing compared
    assert "10 epochs, 0 of 3 pairs (1 plain and 0 patched so far): the whole process" in begun
    assert begun.endswith("| - | 20.00 s | - | - |")
    line = row([fit("plain", 0, 20.0), fit("patched", 0, 10.0)])
    assert "3 images, objects per image median 4 (max 9), 10 epochs, 1 of 3 pairs, end states identical" in line
    assert line.endswith("| 10.00 s | 20.00 s | 2.00x | - |") and "the fit 9.0 / 19.0 s, 2.11x" in line
    pairs = [fit("plain", 0, 20.0), fit("patched", 0, 10.0), fit("patched", 1, 10.0), fit("plain", 1, 20.0),
             fit("plain", 2, 20.0), fit("patched", 2, 10.0)]
    assert ", 3 pairs, end states identical" in row(pairs)
    pairs[1]["digests"]["ema"] = "b"
    assert "end states DIFFER in ema" in row(pairs)
    pairs[0]["digests"]["ema"] = "c"
    assert "the plain fits differ among themselves (not deterministic), so not compared" in row(pairs)


def test_yolo_dataset_validates_on_its_first_images(tmp_path):
    """write_yolo_dataset(val_images=k): the validation split is the first k training images, as the peer reads it."""
    pytest.importorskip("cv2")
    from lucid_assign.synthetic import write_yolo_dataset

    yaml = write_yolo_dataset(tmp_path / "d", images=5, img_size=32, obb=False, image_ext="jpg", val_images=2)
    assert "val: val.txt" in open(yaml).read()
    assert (tmp_path / "d" / "val.txt").read_text().split() == ["./images/train/00000.jpg", "./images/train/00001.jpg"]
    if importlib.util.find_spec("ultralytics") is not None:
        from ultralytics.data.utils import check_det_dataset
        from ultralytics.data.dataset import YOLODataset

        assert len(YOLODataset(check_det_dataset(yaml)["val"], imgsz=32, data=check_det_dataset(yaml)).im_files) == 2
    with pytest.raises(ValueError, match="val_images"):
        write_yolo_dataset(tmp_path / "e", images=2, img_size=32, val_images=3)


def test_the_detr_pattern_bench_runs_and_agrees(tmp_path, library):
    """bench/detr_pattern.py, tiny: every layer's matches own and patched the same, one op solve a layer, no SciPy."""
    path, _ = _bench_script("detr_pattern")
    out = tmp_path / "rec.json"
    run = subprocess.run([sys.executable, path, "--device", "cpu", "--batch", "2", "--objects", "0", "5", "--layers",
                          "3", "--queries", "7", "--calls", "1", "--out", str(out)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    cases = json.loads(out.read_text())["cases"]
    assert [(c["objects"], c["same"], c["op_calls"], c["scipy_calls"]) for c in cases] == [(0, True, 0, 0),
                                                                                          (5, True, 3, 0)]


def test_the_matcher_ops_bench_counts_a_loss_call(library):
    """bench/matcher_ops.py, tiny: each family's loss call, own and patched, counted; the transformers families'
    patched one within the goal of the issue "The DETR cost in one launch" on the CPU: 12 operations or fewer, one
    synchronisation at most. RF-DETR's criterion: one call of its matcher patched (the layers' forwards unpatched)."""
    pytest.importorskip("transformers")
    pytest.importorskip("rfdetr")
    path, _ = _bench_script("matcher_ops")
    families = {"rt-detr": 7, "detr": 6, "deformable-detr": 6, "lw-detr": 4}  # the matcher calls of a loss call
    # 320 px: the two-stage families pick their 300 proposals among more anchors than that
    run = subprocess.run([sys.executable, path, "--families", *families, "rf-detr", "--imgsz", "320", "--batch", "1",
                          "--objects", "2"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    own, patched = [line.split() for line in run.stdout.splitlines() if line.startswith("rf-detr ")]
    assert (own[1:3], patched[1:3]) == (["own", "5"], ["patched", "1"]) and int(own[3]) > int(patched[3]) > 0
    for family, calls in families.items():
        rows = [line.split() for line in run.stdout.splitlines() if line.startswith(family + " ")]
        assert [(r[1], r[2]) for r in rows] == [("own", str(calls)), ("patched", str(calls))], (family, rows)
        own, patched = rows
        assert int(own[3]) > int(patched[3]) > 0 and int(patched[3]) <= 12 and int(patched[4]) <= 1, (family, rows)


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_the_matcher_ops_bench_counts_rfdetrs_batched_path(library, precision):
    """bench/matcher_ops.py, RF-DETR Small's criterion at batch 2 in float32 (its batched path) and under bf16
    autocast (on the CPU its encoder's boxes bf16: each layer as its forward computes it): the patched call with
    RF-DETR's cost from the op dispatches fewer operations than with RF-DETR's own cost operations (without the op,
    under autocast, each layer's forward and its synchronisations); with the op one synchronisation, within the goal
    of the issue "The DETR cost in one launch" (12 operations)."""
    pytest.importorskip("rfdetr")
    path, _ = _bench_script("matcher_ops")
    counts = {}
    for cost_op in ("off", "on"):
        run = subprocess.run([sys.executable, path, "--families", "rf-detr", "--imgsz", "320", "--batch", "2",
                              "--objects", "3", "--precision", precision, "--cost-op", cost_op],
                             capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-2000:]
        own, patched = [line.split() for line in run.stdout.splitlines() if line.startswith("rf-detr ")]
        assert patched[1] == "patched" and int(own[3]) > int(patched[3]), (cost_op, patched)
        assert patched[4] == "1" or (cost_op, precision) == ("off", "bf16"), (cost_op, patched)
        counts[cost_op] = int(patched[3])
    assert counts["on"] < counts["off"] and counts["on"] <= 12, counts


def test_the_transformers_step_bench_writes_the_record_the_readme_rows_come_from(library, tmp_path):
    """bench/train_step_transformers.py --out, tiny: a record per family and object count, own and patched; the
    README's row of it (scripts/figures.py) carries its figures. With --profile, a patched step's calls profiled (the
    first call's parts, the others')."""
    pytest.importorskip("transformers")
    path, _ = _bench_script("train_step_transformers")
    out = tmp_path / "bench-step-transformers.json"
    run = subprocess.run([sys.executable, path, "--device", "cpu", "--family", "detr", "--imgsz", "64", "--batch", "1",
                          "--objects", "2", "--steps", "1", "--warmup", "1", "--profile", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    first = next(line for line in run.stdout.splitlines() if "profiled, the first call:" in line)
    assert "_op_problems" in first and "solve" in first and "served_again" in next(
        line for line in run.stdout.splitlines() if "profiled, the others:" in line)
    assert len(next(line for line in run.stdout.splitlines() if "profiled: the calls" in line).split("ms;")[0]
               .split("the calls")[1].split()) == 6
    rec = json.loads(out.read_text())
    (r,) = rec["results"]
    assert (r["family"], r["batch"], r["objects"], r["own"]["calls"], r["patched"]["calls"]) == ("detr", 1, 2, 6, 6)
    for run_ in (r["own"], r["patched"]):  # one instrumented step: each call's time, adding up to the matcher's
        assert len(run_["call_s"]) == 6 and sum(run_["call_s"]) == run_["matcher_s"]
    assert rec["environment"]["transformers"] and rec["environment"]["gpu"] == "cpu"
    module = _figures()
    (row,) = module._step_rows(rec)
    assert row.startswith("| transformers DETR with auxiliary losses training step, b1 at 64 px, 2 objects")
    assert f"{1e3 * r['patched']['step_s']:,.3g} ms" in row or f"{1e3 * r['patched']['step_s']:,.0f} ms" in row
    header = module._step_header([rec])
    assert "`python bench/train_step_transformers.py --family detr --steps 1 --warmup 1 --out" in header
    assert f"transformers {rec['environment']['transformers']}" in header


def test_the_figures_header_names_each_records_own_machine_and_date(monkeypatch):
    """scripts/figures.py: records made on two machines: each command appears once, after its own machine and date."""
    figures = _figures()

    def record(gpu, date, kind):
        env = dict(gpu=gpu, torch="2.11.0", cuda="13.0", date=date)
        return dict(environment=env, args=dict(kind=kind, objects=[10], device="cuda", backends="kernel,peer", reps=5),
                    results=[])

    records = [record("GPU A", "2026-01-01", "obb"), record("GPU B", "2026-02-02", "hbb")]
    monkeypatch.setattr(figures, "_records", lambda prefix="bench-cuda-": records if prefix == "bench-cuda-" else [])
    header = " ".join(figures.table().splitlines()[1:4])
    a = header.index("GPU A, torch 2.11.0 (CUDA 13.0), 2026-01-01:")
    b = header.index("GPU B, torch 2.11.0 (CUDA 13.0), 2026-02-02:")
    assert a < header.index("--kind obb") < b < header.index("--kind hbb")
    assert header.count("--kind obb") == header.count("--kind hbb") == 1 and "2026-01-01 to" not in header
