"""The segmentation assignment (docs/spec.md, "Segmentation"): the reference against the peer's SegTaskAlignedAssigner
(ultralytics 8.4.190) and the kernels against the reference, on every device; on CUDA the kernel against the peer
directly, in the training case (bfloat16 under autocast).

On the CPU the peer runs with ties to the lower index (test_reference_vs_peer.py). The CPU kernel's overlaps are the
reference's bits (the box overlap, pixel counts, the mean), its metric's power is the C library's: its scores are
compared to the reference's within the relative 1e-6 of docs/spec.md, its discrete outputs exactly.
"""

import contextlib

import pytest
import torch

import lucid_assign
from lucid_assign import api, checks, dispatch, ops, reference

from cases import MODEL_SETTING_IDS as SETTING_IDS, MODEL_SETTINGS as SETTINGS, STRIDE_VAL, STRIDES
from cases import seg_problem as problem
from conftest import devices
from contract import assert_matches, assert_same, lower_index_topk

BOX, SEG = reference.INPUTS, reference.SEG_INPUTS


def autocast(device, on):
    """The trainer's context: CUDA autocast to bfloat16 (the metric's power in float32, the decode in bfloat16)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if on and device == "cuda" else contextlib.nullcontext()


def run_peer(tal, device, inputs, amp=False, **kw):
    peer = tal.SegTaskAlignedAssigner(stride=list(STRIDES), **kw)
    with lower_index_topk(device), autocast(device, amp):
        return peer(*inputs[:6], **dict(zip(SEG, inputs[6:])))


def run_kernel(inputs, amp=False, **kw):
    with autocast(inputs[0].device.type, amp):
        return ops.assign_seg(*inputs, stride_val=STRIDE_VAL, **kw)


def run_reference(inputs, amp=False, **kw):
    with autocast(inputs[0].device.type, amp):
        return reference.assign_seg(*inputs, stride=STRIDES, **kw)


def assert_kernel_matches(got, want, device, case=""):
    """The contract for a kernel (contract.py): bit for bit on CUDA; on the CPU within CPU_SCORE_RTOL."""
    assert_matches(got, want, device == "cuda", case)


def reference_mask_calls(inputs, **kw):
    """The reference run on CPU copies of the inputs: the arguments (b, m, a, pd_bboxes) and the result of each call
    of its mask IoUs."""
    calls = []
    original = reference.SegInputs.mask_ious

    def spy(self, *args):
        out = original(self, *args)
        calls.append((args, out))
        return out

    reference.SegInputs.mask_ious = spy
    try:
        reference.assign_seg(*[t.cpu() for t in inputs], stride=STRIDES, **kw)
    finally:
        reference.SegInputs.mask_ious = original
    return calls


def mask_ious_used(inputs, **kw):
    """How many chosen pairs get a nonzero mask IoU (the case must exercise the masks, not only boxes)."""
    return sum(int((out > 0).sum()) for _, out in reference_mask_calls(inputs, **kw))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("trainer_dtypes", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", range(3))
def test_reference_matches_peer(peer_tal, device, setting, trainer_dtypes, seed):
    inputs = problem(seed, trainer_dtypes=trainer_dtypes, device=device)
    kw = dict(num_classes=3, beta=6.0, **setting)
    ours = run_reference(inputs, amp=trainer_dtypes, **kw)
    assert_same(ours, run_peer(peer_tal, device, inputs, amp=trainer_dtypes, **kw), f"seed={seed}")
    assert ours[3].any()


def test_the_masks_change_the_assignment():
    """The case is a segmentation case: mask IoUs are nonzero and the result differs from the box assignment's."""
    inputs = problem(0)
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    assert mask_ious_used(inputs, **kw) > 20
    seg = run_reference(inputs, **kw)
    box = reference.assign(*inputs[:6], stride=STRIDES, **kw)
    assert not torch.equal(seg[2], box[2]) and not torch.equal(seg[3], box[3])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("trainer_dtypes", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", range(3))
def test_kernel_matches_reference(library, device, setting, trainer_dtypes, seed):
    inputs = problem(seed, trainer_dtypes=trainer_dtypes, device=device)
    kw = dict(num_classes=3, beta=6.0, **setting)
    assert_kernel_matches(run_kernel(inputs, amp=trainer_dtypes, **kw),
                          run_reference(inputs, amp=trainer_dtypes, **kw), device, f"seed={seed}")


@pytest.mark.cuda
@pytest.mark.parametrize("setting", SETTINGS[:2], ids=SETTING_IDS[:2])
@pytest.mark.parametrize("objects", [(20, 20), (100, 100)], ids=["m20", "m100"])
def test_kernel_matches_peer_on_cuda(peer_tal, library, setting, objects):
    """The training case: batch 16 at 640 px, 80 classes, 32 prototypes at 160 x 160, the trainer's dtypes under
    autocast, the peer unpatched on CUDA."""
    inputs = problem(4, batch=16, img_size=640, objects=objects, num_classes=80, mask_dim=32, trainer_dtypes=True,
                     device="cuda")
    kw = dict(num_classes=80, beta=6.0, **setting)
    module = lucid_assign.SegTaskAlignedAssigner(stride=list(STRIDES), backend="kernel", **kw)
    with autocast("cuda", True):
        ours = module(*inputs[:6], **dict(zip(SEG, inputs[6:])))
    assert_same(ours, run_peer(peer_tal, "cuda", inputs, amp=True, **kw))


@pytest.mark.cuda
def test_autocast_casts_the_decode(peer_tal, library):
    """float32 coefficients and prototypes under bf16 autocast: the decode runs in bfloat16, as the peer's does (and
    differs from the float32 decode outside autocast)."""
    inputs = problem(5, batch=4, img_size=320, objects=(30, 40), mask_dim=32, device="cuda")
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    assert_same(run_kernel(inputs, amp=True, **kw), run_peer(peer_tal, "cuda", inputs, amp=True, **kw))
    assert_same(run_kernel(inputs, **kw), run_peer(peer_tal, "cuda", inputs, **kw))


def test_cpu_autocast(library):
    """Under torch.autocast("cpu") the decode's product runs in bfloat16 (matmul is on CPU autocast's list) for the
    reference and the CPU kernel alike (the kernel calls ATen's product, which autocast casts as it casts the
    reference's): equal, and unlike the float32 decode outside autocast. (The peer also runs its intersection product
    under CPU autocast, docs/odd-inputs.md.)"""
    inputs = problem(5, batch=4, img_size=320, objects=(30, 40), mask_dim=32)
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = run_reference(inputs, **kw)
        got = run_kernel(inputs, **kw)
    assert_kernel_matches(got, want, "cpu")
    plain = run_reference(inputs, **kw)
    assert not torch.equal(want[2], plain[2]), "the scene's decode must depend on the product's dtype"


def odd(case, device):
    """Odd and edge inputs, each defined in docs/odd-inputs.md: the results are the reference's (equal to the
    peer's)."""
    inputs = problem(11, objects=(10, 16), device=device)
    pd, gt, coef, scale, proto, masks = (inputs[i].clone() for i in (1, 4, 6, 7, 8, 9))
    if case == "empty_object_masks":
        masks[:] = False
    elif case == "empty_predicted_masks":  # every decoded value exactly 0: no pixel is > 0
        coef[:] = 0.0
    elif case == "full_predicted_masks":  # every decoded value > 0: the predicted mask is its box's crop
        coef, proto = coef.abs() + 0.01, proto.abs() + 0.01
    elif case == "tiny_objects":  # 0.5-3 px objects and predictions: crops of a pixel or none
        c = (gt[..., :2] + gt[..., 2:]) / 2
        side = 0.5 + torch.rand(gt.shape[:2] + (1,), generator=torch.Generator().manual_seed(1)).to(device) * 2.5
        gt = torch.cat((c - side / 2, c + side / 2), -1)
        pc = (pd[..., :2] + pd[..., 2:]) / 2
        pd = torch.cat((pc - 1, pc + 1), -1)
    elif case == "image_sized_objects":  # objects and predictions covering the image and beyond: crops clamp
        gt[:, :4] = torch.tensor([-20.0, -10.0, 170.0, 165.0], device=device)
        masks[:, :4] = True
        pd[:, ::3] = torch.tensor([-50.0, -50.0, 300.0, 300.0], device=device)
    elif case == "predictions_outside_the_image":  # empty crops
        pd[:, 1::2] -= 400.0
    elif case == "nan_predicted_box":  # NaN overlap and metric: chosen first, an empty crop, NaN overlap
        pd[0, 100:140, 1] = float("nan")
    elif case == "nan_coefficients":  # NaN > 0 is false: empty predicted masks
        coef[1, :300] = float("nan")
    elif case == "zero_mask_scale":  # every crop empty
        scale[:] = 0.0
    elif case == "number_masks":  # uint8 0/1 masks: nonzero is inside
        masks = masks.to(torch.uint8)
    elif case == "more_mask_rows":  # gt_masks with more rows than the boxes (the peer's loss may pass such)
        masks = torch.cat((masks, masks[:, :3]), 1)
    elif case == "float64":  # float64 boxes, scores and masks (the CPU kernel's other dtype)
        inputs = [t.double() if t.is_floating_point() else t for t in inputs]
        pd, gt, coef, scale, proto = (inputs[i].clone() for i in (1, 4, 6, 7, 8))
    else:
        raise AssertionError(case)
    inputs[1], inputs[4], inputs[6], inputs[7], inputs[8], inputs[9] = pd, gt, coef, scale, proto, masks
    return inputs


ODD = ["empty_object_masks", "empty_predicted_masks", "full_predicted_masks", "tiny_objects", "image_sized_objects",
       "predictions_outside_the_image", "nan_predicted_box", "nan_coefficients", "zero_mask_scale", "number_masks",
       "more_mask_rows", "float64"]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", ODD)
def test_odd_inputs(peer_tal, library, device, case):
    inputs = odd(case, device)
    if case == "float64" and device == "cuda":
        pytest.skip("the CUDA kernel takes float32 boxes")
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw), case)
    assert_kernel_matches(run_kernel(inputs, **kw), want, device, case)


def test_negative_scores(peer_tal, library):
    """Scores below 0 with alpha 1 (docs/odd-inputs.md): negative metrics, which rank below the zero of the anchors
    outside an object's region, so only an image-sized object (every anchor a candidate) has positives with them; as
    the one object row of its image, it gives negative normalised metrics. The reference is the peer to the sign of
    its zeros (some -0, from the dense maximum over the rows); the kernel's scores equal them in value (their zeros'
    signs may differ, docs/spec.md, "Precision"). On the CPU, where the peer runs with the tie rule."""
    inputs = problem(27, objects=(1, 1))
    inputs[0] = -inputs[0]
    box = torch.tensor([-8.0, -8.0, 168.0, 168.0])
    inputs[4] = box.expand_as(inputs[4]).clone()
    inputs[1] = box + 4 * inputs[1] / inputs[1].amax()  # predictions near the object: overlaps near 1
    kw = dict(num_classes=3, topk=10, alpha=1.0, beta=6.0)
    want = run_reference(inputs, **kw)
    theirs = run_peer(peer_tal, "cpu", inputs, **kw)
    assert_same(want, theirs)
    assert torch.equal(want[2].signbit(), theirs[2].signbit())
    assert ((want[2] == 0) & want[2].signbit()).any(), "the scene must give the peer's -0 scores"
    got = run_kernel(inputs, **kw)
    assert_kernel_matches(got, want, "cpu")
    labels, scores, fg = got[0], got[2], got[3]
    assert (scores.gather(-1, labels.clamp(max=2)[..., None])[..., 0][fg] < 0).any(), "negative normalised metrics"


@pytest.mark.parametrize("device", devices())
def test_a_flat_mask_scale(library, device):
    """mask_scale as (B,) instead of the peer's (B, 1): the same result on every backend."""
    inputs = problem(26, device=device)
    flat = list(inputs)
    flat[7] = inputs[7].reshape(-1)
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(run_reference(flat, **kw), want)
    assert_kernel_matches(run_kernel(flat, **kw), want, device)


@pytest.mark.parametrize("device", devices())
def test_overlapping_masks(peer_tal, library, device):
    """Objects stacked on one another with overlapping masks: pairs that share anchors and pixels."""
    inputs = problem(12, objects=(12, 12), device=device)
    gt, masks = inputs[4].clone(), inputs[9].clone()
    gt[:, 6:12] = gt[:, 0:6] + 3.0
    masks[:, 6:12] = masks[:, 0:6].roll(1, -1)
    inputs[4], inputs[9] = gt, masks
    assert (masks[:, 6:12] & masks[:, 0:6]).any()
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw))
    assert_kernel_matches(run_kernel(inputs, **kw), want, device)


@pytest.mark.parametrize("device", devices())
def test_many_objects(library, device):
    """300 objects per image at 640 px: long candidate lists, many chosen pairs per image, rows taken by blocks on
    CUDA."""
    inputs = problem(13, batch=2, img_size=640, objects=(250, 300), num_classes=5, mask_dim=16, device=device)
    kw = dict(num_classes=5, topk=10, alpha=0.5, beta=6.0)
    assert_kernel_matches(run_kernel(inputs, **kw), run_reference(inputs, **kw), device)


@pytest.mark.parametrize("device", devices())
def test_large_topk_and_chunks(peer_tal, library, device):
    """topk 40 (120 pairs a row) with 80-100 objects at 640 px: thousands of chosen anchors an image, so that an
    image's decode exceeds half a chunk (2^27 values) and each chunk holds one image."""
    inputs = problem(14, batch=3, img_size=640, objects=(80, 100), device=device)
    kw = dict(num_classes=3, topk=40, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw))
    assert_kernel_matches(run_kernel(inputs, **kw), want, device)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", ["topk_32", "topk_33", "zero_scores", "some_zero_scores", "few_anchors"])
def test_claims_of_chosen_and_other_pairs(peer_tal, library, device, case):
    """On CUDA the claims of a row are merged from its chosen pairs and its K best other anchors (the pairs not
    chosen, ranked before the masks are decoded, and the zero fill) when min(3K, A) + K <= 128, else ranked again over
    all anchors (topk 32 and 33 take the two ways). Zero metrics tie with the zero fill by anchor index (some scores
    0; with all of them 0 no anchor is foreground); with 21 anchors (32 px) every candidate is chosen and the rest of
    the K are the zero fill."""
    topk = {"topk_32": 32, "topk_33": 33}.get(case, 10)
    inputs = problem(17, batch=3, img_size=32 if case == "few_anchors" else 320,
                     objects=(2, 4) if case == "few_anchors" else (10, 30), device=device)
    if case == "zero_scores":
        inputs[0] = torch.zeros_like(inputs[0])
    elif case == "some_zero_scores":
        inputs[0] = inputs[0].clone()
        inputs[0][:, ::3] = 0.0
    kw = dict(num_classes=3, topk=topk, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw), case)
    assert want[3].any() != (case == "zero_scores"), case  # no positive metric: no foreground
    assert_kernel_matches(run_kernel(inputs, **kw), want, device, case)


def chosen_per_image(inputs, **kw):
    """The number of distinct chosen anchors of each image (what the decode orders the images by), from the
    reference's first call."""
    (b, _, a, pd_bboxes), _ = reference_mask_calls(inputs, **kw)[0]
    key = (b * pd_bboxes.shape[1] + a).unique()
    return torch.bincount(key // pd_bboxes.shape[1], minlength=pd_bboxes.shape[0]).tolist()


def argsort_calls(fn):
    """fn's result and how many times it called the sort routine (torch.argsort, seen by the profiler also where the
    compiled kernels call it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, sum(e.name == "aten::argsort" for e in prof.events())


def copies_of_the_first(inputs, batch, reduce_last=False):
    """`batch` images, each a copy of the first of `inputs` in what decides the chosen anchors (scores, boxes,
    labels, objects), so that their counts are equal; the prototypes differ (image b adds 0.3 b times the first
    image's field shifted by 13 b pixels), so that their predicted masks and mask IoUs do not. reduce_last: the last
    image keeps half its objects (a smaller count)."""
    out = [t if i == 2 else t[:1].expand(batch, *t.shape[1:]).clone() for i, t in enumerate(inputs)]  # anc_points
    first = inputs[8][0]
    out[8] = torch.stack([first + 0.3 * b * first.roll(13 * b, dims=-1) for b in range(batch)])
    if reduce_last:
        out[5][-1, out[5].shape[1] // 2:] = 0  # mask_gt
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("counts", ["distinct", "equal", "distinct_and_zeros", "equal_within_a_chunk",
                                    "equal_across_chunks"])
def test_images_ordered_by_count(peer_tal, library, device, counts):
    """The decode takes the images by decreasing count of chosen anchors. The order among equal counts decides which
    images share a chunk only where equal counts meet at a chunk's end, so the kernels call the sort routine there
    alone and order the images themselves otherwise: "equal" (four images, one chunk), "equal_within_a_chunk" (640
    px, five images of which four equal ones fill the first chunk, the last image smaller) and
    "equal_across_chunks" (five equal images: four in the first chunk, one in the second). The images share the
    counts, not the masks: an image's mask IoUs put in another's place would change the result. Images without
    chosen anchors (two without objects) are never decoded, so their equal counts need no sort. Every way must give
    the peer's result."""
    big = counts in ("equal_within_a_chunk", "equal_across_chunks")
    batch = 5 if counts in ("distinct_and_zeros", "equal_within_a_chunk", "equal_across_chunks") else 4
    if big:  # an image of 1,118 chosen anchors at 640 px: chunks of 4 images (2^27 // (1118 * 160 * 160))
        inputs = problem(32, batch=2, img_size=640, objects=(25, 35), device=device)
        kw = dict(num_classes=3, topk=40, alpha=0.5, beta=6.0)
    else:
        inputs = problem(16, batch=batch, objects=(6, 20), device=device)
        kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    if counts.startswith("equal"):
        inputs = copies_of_the_first(inputs, batch, reduce_last=counts == "equal_within_a_chunk")
    if counts == "distinct_and_zeros":
        inputs[5] = inputs[5].clone()
        inputs[5][1::2] = 0  # mask_gt: images 1 and 3 without objects
    n = chosen_per_image(inputs, **kw)
    positive = [c for c in n if c > 0]
    if counts == "equal" or counts == "equal_across_chunks":
        assert len(set(n)) == 1 and n[0] > 0, n
    elif counts == "equal_within_a_chunk":
        assert len(set(n[:-1])) == 1 and 0 < n[-1] < n[0], n
    else:
        assert len(set(positive)) == len(positive) and len(n) - len(positive) == (2 if counts != "distinct" else 0), n
    if big:
        mh, mw = inputs[8].shape[-2:]
        assert reference.SEG_CHUNK_PIXELS // (n[0] * mh * mw) == 4, n
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw))
    if counts.startswith("equal"):  # the images' results differ (their masks do)
        assert any(not torch.equal(want[2][0], want[2][b]) for b in range(1, batch)), counts
    got, sorts = argsort_calls(lambda: run_kernel(inputs, **kw))
    assert sorts == (1 if counts == "equal_across_chunks" else 0), (counts, sorts)
    assert_kernel_matches(got, want, device)


@pytest.mark.parametrize("device", devices())
def test_no_objects_and_padding(peer_tal, library, device):
    inputs = problem(15, device=device)
    empty = list(inputs)
    empty[3], empty[4], empty[5] = (t[:, :0] for t in (inputs[3], inputs[4], inputs[5]))
    kw = dict(num_classes=3, topk=10)
    got = run_kernel(empty, **kw)
    assert (got[0] == 3).all() and not got[3].any() and not got[2].any()
    padded = list(inputs)
    padded[5] = torch.zeros_like(inputs[5])
    want = run_reference(padded, **kw)
    assert_same(want, run_peer(peer_tal, device, padded, **kw))
    assert_kernel_matches(run_kernel(padded, **kw), want, device)


@pytest.mark.parametrize("device", devices())
def test_inputs_not_modified(library, device):
    inputs = problem(16, trainer_dtypes=True, device=device)
    before = [t.clone() for t in inputs]
    run_kernel(inputs, num_classes=3, topk=7, topk2=3)
    api.assign_seg(*inputs, num_classes=3, topk=7, topk2=3, backend="reference")
    for a, b in zip(inputs, before):
        assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda x: x.__setitem__(6, x[6][..., :3]), "pd_coef must (have shape|be)"),
        (lambda x: x.__setitem__(7, x[7][:1]), "mask_scale must (have shape|be)"),
        (lambda x: x.__setitem__(8, x[8][..., :5]), "gt_masks must be"),
        (lambda x: x.__setitem__(9, x[9][:, :1]), "gt_masks must be"),
        (lambda x: x.__setitem__(8, x[8][0]), "proto must be"),
        (lambda x: x.__setitem__(7, x[7].long()), "mask_scale must be (a float16|float32)"),
        (lambda x: x.__setitem__(6, x[6].to(torch.float8_e4m3fn)), "pd_coef (and proto )?must be (a )?float16"),
        (lambda x: x.__setitem__(8, x[8].double()), "pd_coef and proto must have one dtype"),
        (lambda x: x.__setitem__(9, x[9].tolist()), "gt_masks must be a torch.Tensor"),
    ],
    ids=["pd_coef", "mask_scale", "mask_size", "mask_rows", "proto", "scale_dtype", "coef_float8", "mixed_dtypes",
         "masks_type"],
)
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_bad_inputs_name_the_argument(change, match, backend):
    """Checked by the op on the kernel path (auto, with the library) and by the Python layer on the reference's."""
    inputs = problem(17)
    change(inputs)
    with pytest.raises((ValueError, TypeError), match=match):
        api.assign_seg(*inputs, num_classes=3, topk=10, backend=backend)


def test_the_kernels_check_their_arguments(library):
    inputs = problem(18)
    bad = list(inputs)
    bad[9] = inputs[9][..., :5]
    with pytest.raises(ValueError, match="gt_masks must be"):
        run_kernel(bad, num_classes=3, topk=10)
    bad = list(inputs)
    bad[7] = inputs[7].half()
    with pytest.raises(TypeError, match="mask_scale must be float32 or float64"):
        run_kernel(bad, num_classes=3, topk=10)
    bad = list(inputs)
    bad[1] = torch.cat((inputs[1], torch.zeros_like(inputs[1][..., :1])), -1)
    bad[4] = torch.cat((inputs[4], torch.zeros_like(inputs[4][..., :1])), -1)
    with pytest.raises(ValueError, match="x1y1x2y2"):
        run_kernel(bad, num_classes=3, topk=10)


@pytest.mark.cuda
def test_pair_slot_limit(library):
    """On CUDA the pieces of the chosen pairs' pixel counts are indexed in 32 bits: more than (2^31 - 1) // 8 pair
    slots (B x M x min(3 * topk, A)) is an error naming them, raised before any work (docs/odd-inputs.md)."""
    limit = (2**31 - 1) // 8
    anchors, topk = 30, 10  # min(3 * topk, A) = 30
    objects = limit // anchors + 1
    z = dict(device="cuda")
    inputs = [torch.rand(1, anchors, 3, **z), torch.rand(1, anchors, 4, **z), torch.rand(anchors, 2, **z),
              torch.zeros(1, objects, 1, **z), torch.zeros(1, objects, 4, **z), torch.zeros(1, objects, 1, **z),
              torch.rand(1, anchors, 2, **z), torch.ones(1, 1, **z), torch.rand(1, 2, 1, 1, **z),
              torch.zeros(1, objects, 1, 1, dtype=torch.bool, **z)]
    with pytest.raises(ValueError, match=f"too many pair slots .*1 x {objects} x {anchors}; at most {limit}"):
        run_kernel(inputs, num_classes=3, topk=topk)


def test_the_kernel_path_is_checked_by_the_op(library, monkeypatch):
    """As for assign (test_dispatch.py): a call the kernel takes runs no Python check of its tensors, whatever its
    object count, and gives the reference's outputs; gt_masks with fewer rows than objects are refused by the op, and
    so are pd_coef and proto of two dtypes outside the autocast that lets them pass."""
    checked = []
    real = checks.check_seg_inputs
    monkeypatch.setattr(checks, "check_seg_inputs", lambda *a: checked.append(1) or real(*a))
    kw = dict(num_classes=3, topk=10)
    inputs = problem(40)
    n_boxes = inputs[4].shape[1]
    assert n_boxes > 3 and inputs[9].shape[1] == n_boxes
    fewer = [t[:, :3] if i in (3, 4, 5) else t for i, t in enumerate(inputs)]  # gt_masks: more rows than objects
    for x in (inputs, fewer):
        assert_kernel_matches(api.assign_seg(*x, **kw), run_reference(x, **kw), "cpu")
    bad = list(inputs)
    bad[9] = inputs[9][:, : n_boxes - 1]
    with pytest.raises(ValueError, match="gt_masks must be"):
        api.assign_seg(*bad, **kw)
    mixed = list(inputs)
    mixed[6] = inputs[6].bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        api.assign_seg(*mixed, **kw)
    with pytest.raises(TypeError, match="pd_coef and proto must have one dtype outside autocast"):
        api.assign_seg(*mixed, **kw)
    assert checked == []


@pytest.mark.parametrize("eps", [0.0, -1e-9, float("nan")])
def test_eps_must_be_positive(library, eps):
    """Step 6 divides by pa + eps: with eps <= 0 a row owning nothing divides 0 by 0, so eps is refused."""
    inputs = problem(25)
    with pytest.raises(ValueError, match="eps must be a positive number"):
        api.assign_seg(*inputs, num_classes=3, topk=10, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive number"):
        api.assign(*inputs[:6], num_classes=3, topk=10, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive number"):
        run_kernel(inputs, num_classes=3, topk=10, eps=eps)


def test_a_half_mask_scale_runs_on_the_reference(library):
    """A float16 mask_scale is not a kernel's dtype: backend "auto" runs the reference, saying why."""
    inputs = problem(19)
    inputs[7] = inputs[7].half()
    with pytest.warns(UserWarning, match="mask_scale"):
        got = api.assign_seg(*inputs, num_classes=3, topk=10)
    assert_same(got, run_reference(inputs, num_classes=3, topk=10))


def test_masks_beyond_the_kernels_limit_run_on_the_reference(library, monkeypatch):
    """The mask-pixel limit is the library's (exact float32 counts), not the reference's: masks of more pixels run on
    the reference with "auto", saying why, and the kernel refuses them. The limit is lowered here to this batch's
    8 x 8 masks less one, so that the test needs no mask of 2^24 pixels."""
    inputs = problem(19)
    pixels = inputs[8].shape[-2] * inputs[8].shape[-1]
    assert lucid_assign._library.limit("MAX_MASK_PIXELS") >= pixels
    real = lucid_assign._library.limit
    monkeypatch.setattr(lucid_assign._library, "limit",
                        lambda name: pixels - 1 if name == "MAX_MASK_PIXELS" else real(name))
    dispatch._unsupported.clear()
    with pytest.warns(UserWarning, match=f"at most {pixels - 1} pixels"):
        got = api.assign_seg(*inputs, num_classes=3, topk=10)
    assert_same(got, run_reference(inputs, num_classes=3, topk=10))
    with pytest.raises(RuntimeError, match="backend='kernel' cannot run"):
        api.assign_seg(*inputs, num_classes=3, topk=10, backend="kernel")
    dispatch._unsupported.clear()


@pytest.mark.cuda
def test_memory_bounded(library):
    """No (B, M, A) tensor and no (pairs x mask pixels) one beyond the decode's chunk: 16 images of 400 objects at 640
    px would need 16 * 400 * 8400 = 54M elements per dense tensor; the call's peak beyond its inputs is its outputs,
    one decoded chunk (at most 2^27 values, or one image's) and little else."""
    inputs = problem(20, batch=16, img_size=640, objects=(400, 400), num_classes=80, mask_dim=32, trainer_dtypes=True,
                     device="cuda")
    kw = dict(num_classes=80, topk=10)
    run_kernel(inputs, **kw)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = run_kernel(inputs, **kw)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    outputs = sum(t.numel() * t.element_size() for t in out)
    pixels = inputs[8].shape[-2] * inputs[8].shape[-1]
    chunk = max(1 << 27, 8400 * pixels) * 2  # bfloat16 values; an image has at most A chosen anchors
    dense = 16 * 400 * 8400  # one bool per (image, row, anchor)
    assert peak - outputs - chunk < dense / 4, f"peak {peak} bytes beyond the inputs, outputs {outputs}"


def test_module_constructor_and_defaults():
    m = lucid_assign.SegTaskAlignedAssigner(topk=7, num_classes=4, alpha=0.5, beta=6.0, stride=[8, 16, 32], topk2=1,
                                            backend="reference")
    assert m.topk == 7 and m.topk2 == 1 and m.eps == 1e-9
    inputs = problem(21, num_classes=4)
    with pytest.raises(TypeError, match="pd_coef"):
        m(*inputs[:6])
    out = m(*inputs[:6], **dict(zip(SEG, inputs[6:])))
    want = reference.assign_seg(*inputs, num_classes=4, topk=7, topk2=1, alpha=0.5, stride=STRIDES)
    for a, b in zip(out, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", devices())
def test_compile_fullgraph(library, device):
    """A torch.compile(fullgraph=True) loss over api.assign_seg equals eager, over three batches (the op's one
    synchronisation is inside it)."""
    kw = dict(num_classes=3, topk=10, topk2=4, alpha=0.5)

    def loss(*args):
        labels, boxes, scores, fg, idx = api.assign_seg(*args, **kw)
        return scores.sum(-1), fg, idx

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    for seed in (22, 23, 24):
        inputs = problem(seed, objects=(12, 12), device=device)
        assert all(torch.equal(a, b) for a, b in zip(compiled(*inputs), loss(*inputs)))


@pytest.mark.cuda
def test_sanitize_subset(library):
    """A small run of every segmentation kernel (used under compute-sanitizer's memcheck, scripts/check_cuda.sh): the
    trainer's dtypes under autocast, a second top-k, odd masks and crops."""
    cases = [problem(31, trainer_dtypes=True, device="cuda"), odd("image_sized_objects", "cuda"),
             odd("tiny_objects", "cuda"), odd("number_masks", "cuda")]
    for amp, inputs in zip((True, False, False, False), cases):
        kw = dict(num_classes=3, topk=10, topk2=4, alpha=0.5)
        assert_same(run_kernel(inputs, amp=amp, **kw), run_reference(inputs, amp=amp, **kw))
