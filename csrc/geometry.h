// Box geometry shared by the CPU and CUDA kernels. Torch-free, header-only, host and device.
//
// Every function here is a step of docs/spec.md, as a chain of separately rounded operations in the same order as the
// pure-PyTorch reference (lucid_assign/reference.py). On the device the rounding of each step is made explicit
// with __f*_rn / __d*_rn intrinsics so that nvcc can never fuse a multiply and an add that the reference rounds apart;
// the host build uses -ffp-contract=off for the same reason.
//
// Trigonometric values of the box angles are inputs rather than computed here: the reference takes them from
// PyTorch's own math library on each device (CUDA's cosf/sinf on the GPU, ATen's vectorised functions on the CPU),
// and each backend passes in values from that same library.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LUCID_HD __host__ __device__ __forceinline__
#else
#define LUCID_HD inline
#endif

namespace lucid {
namespace geom {

// ---- separately rounded arithmetic ----------------------------------------------------------------------------
// add, sub, mul and div of two floats or two doubles, each rounded on its own: on the device by the __f*_rn /
// __d*_rn intrinsics, which nvcc never contracts into a fused multiply-add.
#if defined(__CUDA_ARCH__)
#define LUCID_ROUNDED(name, op, float_rn, double_rn)                        \
  LUCID_HD float name(float a, float b) { return float_rn(a, b); }        \
  LUCID_HD double name(double a, double b) { return double_rn(a, b); }
#else
#define LUCID_ROUNDED(name, op, float_rn, double_rn)                        \
  LUCID_HD float name(float a, float b) { return a op b; }                \
  LUCID_HD double name(double a, double b) { return a op b; }
#endif
LUCID_ROUNDED(add, +, __fadd_rn, __dadd_rn)
LUCID_ROUNDED(sub, -, __fsub_rn, __dsub_rn)
LUCID_ROUNDED(mul, *, __fmul_rn, __dmul_rn)
LUCID_ROUNDED(div, /, __fdiv_rn, __ddiv_rn)
#undef LUCID_ROUNDED

// Math functions of the backend's library: CUDA's on the device, the C library's on the host.
LUCID_HD float sqrt_(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
LUCID_HD double sqrt_(double x) { return std::sqrt(x); }
LUCID_HD float log_(float x) { return ::logf(x); }
LUCID_HD double log_(double x) { return ::log(x); }
LUCID_HD float exp_(float x) { return ::expf(x); }
LUCID_HD float log1p_(float x) { return ::log1pf(x); }
LUCID_HD double exp_(double x) { return ::exp(x); }
LUCID_HD float pow_(float x, float e) { return ::powf(x, e); }
LUCID_HD double pow_(double x, double e) { return ::pow(x, e); }

// PyTorch's minimum/maximum/clamp propagate NaN.
template <typename T>
LUCID_HD bool isnan_(T x) {
  return x != x;
}
template <typename T>
LUCID_HD T min_(T a, T b) {
  return isnan_(a) ? a : (isnan_(b) ? b : (b < a ? b : a));
}
template <typename T>
LUCID_HD T max_(T a, T b) {
  return isnan_(a) ? a : (isnan_(b) ? b : (b > a ? b : a));
}
template <typename T>
LUCID_HD T clamp_min(T x, T lo) {
  return x < lo ? lo : x;  // NaN stays NaN
}
template <typename T>
LUCID_HD T clamp_range(T x, T lo, T hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// x.pow(e) for a Python-number exponent, with PyTorch's special cases: e == 0 gives 1, e == 1 a copy, 2 and 3
// repeated products, 0.5 a square root, -1 and -2 reciprocals; other exponents call the library's pow.
template <typename T>
LUCID_HD T pow_scalar(T x, double e) {
  if (e == 0.0) return T(1);
  if (e == 1.0) return x;
  if (e == 2.0) return mul(x, x);
  if (e == 3.0) return mul(mul(x, x), x);
  if (e == 0.5) return sqrt_(x);
  if (e == -0.5) return div(T(1), sqrt_(x));
  if (e == -1.0) return div(T(1), x);
  if (e == -2.0) return div(T(1), mul(x, x));
  return pow_(x, static_cast<T>(e));
}

// ---- step 1, containment: candidate regions ----------------------------------------------------------------------
// The containment threshold of the axis-aligned test: strict, with a margin of 1e-9 in the box's precision.
template <typename T>
LUCID_HD T hbb_margin() {
  return T(1e-9);
}

// What differs between the peer's rule sets (docs/spec.md, "Rule sets"). Step 1: a real object's side below `below` is
// raised to `to` (below = -inf: no floor), and `round_trip` says whether an axis-aligned box goes through centre and
// size (with the floor) or is used as given (then without a floor). Step 2: `classic_ciou`, CIoU's trade-off term as
// releases before 8.4.144 round it (ciou below). Pose: `pose_mean`, the pose assignment of releases 8.4.180 to
// 8.4.186, whose step 1 has no level gate and whose overlap for an object with visible keypoints is
// mean2(box overlap, OKS) instead of the OKS.
template <typename T>
struct RuleSet {
  T below, to;
  bool round_trip, classic_ciou;
  bool pose_mean = false;
};

template <typename T, typename U>
LUCID_HD RuleSet<T> rule_as(const RuleSet<U>& r) {
  return {static_cast<T>(r.below), static_cast<T>(r.to), r.round_trip, r.classic_ciou, r.pose_mean};
}

// Axis-aligned candidate region: x1 y1 x2 y2 after the centre/size round trip and the small-target side floor.
template <typename T>
struct HbbRegion {
  T x1, y1, x2, y2;
};

// box: x1 y1 x2 y2. valid: the row is a real object (padding rows are not floored). Halving is exact, so x/2 and
// x*0.5 give the same bits, which is what both reference devices compute.
template <typename T>
LUCID_HD HbbRegion<T> hbb_candidate_region(T x1, T y1, T x2, T y2, bool valid, const RuleSet<T>& rule) {
  if (!rule.round_trip) return {x1, y1, x2, y2};
  const T half = T(0.5);
  const T cx = mul(add(x1, x2), half);
  const T cy = mul(add(y1, y2), half);
  T w = sub(x2, x1);
  T h = sub(y2, y1);
  if (valid && w < rule.below) w = rule.to;
  if (valid && h < rule.below) h = rule.to;
  const T hw = mul(w, half);
  const T hh = mul(h, half);
  return {sub(cx, hw), sub(cy, hh), add(cx, hw), add(cy, hh)};
}

template <typename T>
LUCID_HD bool hbb_contains(const HbbRegion<T>& r, T px, T py) {
  const T m = hbb_margin<T>();
  return sub(px, r.x1) > m && sub(py, r.y1) > m && sub(r.x2, px) > m && sub(r.y2, py) > m;
}

// Oriented candidate region: corner p1 and the edge vectors ab = p2 - p1, ad = p4 - p1 with their squared lengths.
template <typename T>
struct ObbRegion {
  T ax, ay, abx, aby, adx, ady, nab, nad;
};

// box: cx cy w h, with cos and sin of its angle. Corners: p1 = c+u+v, p2 = c+u-v, p4 = c-u+v with
// u = (w/2 cos, w/2 sin), v = (-h/2 sin, h/2 cos), each sum rounded left to right.
template <typename T>
LUCID_HD ObbRegion<T> obb_candidate_region(T cx, T cy, T w, T h, T cos_t, T sin_t, bool valid,
                                           const RuleSet<T>& rule) {
  const T half = T(0.5);
  if (valid && w < rule.below) w = rule.to;
  if (valid && h < rule.below) h = rule.to;
  const T hw = mul(w, half);
  const T hh = mul(h, half);
  const T ux = mul(hw, cos_t), uy = mul(hw, sin_t);
  const T vx = mul(-hh, sin_t), vy = mul(hh, cos_t);
  const T cux = add(cx, ux), cuy = add(cy, uy);
  const T p1x = add(cux, vx), p1y = add(cuy, vy);
  const T p2x = sub(cux, vx), p2y = sub(cuy, vy);
  const T p4x = add(sub(cx, ux), vx), p4y = add(sub(cy, uy), vy);
  ObbRegion<T> r;
  r.ax = p1x;
  r.ay = p1y;
  r.abx = sub(p2x, p1x);
  r.aby = sub(p2y, p1y);
  r.adx = sub(p4x, p1x);
  r.ady = sub(p4y, p1y);
  r.nab = add(mul(r.abx, r.abx), mul(r.aby, r.aby));
  r.nad = add(mul(r.adx, r.adx), mul(r.ady, r.ady));
  return r;
}

// Closed test: 0 <= ap.ab <= ab.ab and 0 <= ap.ad <= ad.ad. NaN anywhere makes it false.
template <typename T>
LUCID_HD bool obb_contains(const ObbRegion<T>& r, T px, T py) {
  const T apx = sub(px, r.ax), apy = sub(py, r.ay);
  const T dab = add(mul(apx, r.abx), mul(apy, r.aby));
  const T dad = add(mul(apx, r.adx), mul(apy, r.ady));
  return dab >= T(0) && dab <= r.nab && dad >= T(0) && dad <= r.nad;
}

// ---- step 2, overlap: CIoU and probiou ---------------------------------------------------------------------------
constexpr double kIouEps = 1e-7;

// The argument of CIoU's aspect term for box x1 y1 x2 y2: w / (h + eps). Its atan comes from the backend's math
// library (per box, once), the one the reference uses on that device.
template <typename T>
LUCID_HD T ciou_aspect(T x1, T y1, T x2, T y2) {
  return div(sub(x2, x1), add(sub(y2, y1), T(kIouEps)));
}

// Complete-IoU of ground truth g and prediction p (x1 y1 x2 y2), not clamped. atan_g and atan_p are the atan of each
// box's ciou_aspect. classic: the trade-off term aspect / ((aspect - iou) + (1 + eps)), 1 + eps rounded to T, as the
// peer's releases before 8.4.144 compute it; else aspect / (((1 - iou) + aspect) + eps).
template <typename T>
LUCID_HD T ciou(T gx1, T gy1, T gx2, T gy2, T px1, T py1, T px2, T py2, T atan_g, T atan_p, bool classic = false) {
  const T eps = T(kIouEps);
  const T gw = sub(gx2, gx1), gh = add(sub(gy2, gy1), eps);
  const T pw = sub(px2, px1), ph = add(sub(py2, py1), eps);
  const T iw = clamp_min(sub(min_(gx2, px2), max_(gx1, px1)), T(0));
  const T ih = clamp_min(sub(min_(gy2, py2), max_(gy1, py1)), T(0));
  const T inter = mul(iw, ih);
  const T uni = add(sub(add(mul(gw, gh), mul(pw, ph)), inter), eps);
  const T iou = div(inter, uni);
  const T cw = sub(max_(gx2, px2), min_(gx1, px1));
  const T ch = sub(max_(gy2, py2), min_(gy1, py1));
  const T diag2 = add(add(mul(cw, cw), mul(ch, ch)), eps);
  const T dx = sub(sub(add(px1, px2), gx1), gx2);
  const T dy = sub(sub(add(py1, py2), gy1), gy2);
  const T centre2 = mul(add(mul(dx, dx), mul(dy, dy)), T(0.25));  // /4, exact as *0.25
  const T da = sub(atan_p, atan_g);
  const T aspect = mul(mul(da, da), static_cast<T>(4.0 / (3.14159265358979323846 * 3.14159265358979323846)));
  const T trade_off = classic ? div(aspect, add(sub(aspect, iou), static_cast<T>(1.0 + kIouEps)))
                              : div(aspect, add(add(sub(T(1), iou), aspect), eps));
  return sub(iou, add(div(centre2, diag2), mul(aspect, trade_off)));
}

// Covariance [[a, c], [c, b]] of a box's Gaussian: w^2/12, h^2/12 rotated by the angle.
template <typename T>
struct Gauss {
  T a, b, c;
};

// kReciprocal: divide by 12 as PyTorch does on the device (multiplying by the float reciprocal of 12) rather than
// by a true division (PyTorch on the CPU).
template <typename T, bool kReciprocal>
LUCID_HD Gauss<T> gaussian(T w, T h, T cos_t, T sin_t) {
  const T vw = kReciprocal ? mul(mul(w, w), T(1.0 / 12.0)) : div(mul(w, w), T(12));
  const T vh = kReciprocal ? mul(mul(h, h), T(1.0 / 12.0)) : div(mul(h, h), T(12));
  const T cos2 = mul(cos_t, cos_t), sin2 = mul(sin_t, sin_t);
  return {add(mul(vw, cos2), mul(vh, sin2)), add(mul(vw, sin2), mul(vh, cos2)), mul(mul(sub(vw, vh), cos_t), sin_t)};
}

// Probabilistic IoU (1 - Hellinger distance) of ground truth g and prediction p, not clamped, in stages around its
// four math-library calls (sqrt, log, exp, sqrt), so that a backend can evaluate those with another library (on the
// CPU, PyTorch's sqrt is not the correctly rounded one):
//   pre           -> t1 + t2, det and q = det_g * det_p
//   log_arg(sqrt(q))  -> det / (4 sqrt(q) + eps) + eps
//   bd(log(...))      -> clamp(t1 + t2 + log(...) / 2, eps, 100)
//   sqrt_arg(exp(-bd)) -> 1 - exp(-bd) + eps
//   finish(sqrt(...)) -> 1 - sqrt(...)
template <typename T>
struct ProbiouPre {
  T t12, det, q;
};

template <typename T>
LUCID_HD ProbiouPre<T> probiou_pre(T gx, T gy, const Gauss<T>& g, T px, T py, const Gauss<T>& p) {
  const T eps = T(kIouEps);
  const T sa = add(g.a, p.a), sb = add(g.b, p.b), sc = add(g.c, p.c);
  const T det = sub(mul(sa, sb), mul(sc, sc));
  const T dy = sub(gy, py), dx = sub(gx, px);
  const T t1 = mul(div(add(mul(sa, mul(dy, dy)), mul(sb, mul(dx, dx))), add(det, eps)), T(0.25));
  const T t2 = mul(div(mul(mul(sc, sub(px, gx)), sub(gy, py)), add(det, eps)), T(0.5));
  const T det_g = clamp_min(sub(mul(g.a, g.b), mul(g.c, g.c)), T(0));
  const T det_p = clamp_min(sub(mul(p.a, p.b), mul(p.c, p.c)), T(0));
  return {add(t1, t2), det, mul(det_g, det_p)};
}

template <typename T>
LUCID_HD T probiou_log_arg(T det, T sqrt_q) {
  return add(div(det, add(mul(sqrt_q, T(4)), T(kIouEps))), T(kIouEps));
}

template <typename T>
LUCID_HD T probiou_bd(T t12, T log_value) {
  return clamp_range(add(t12, mul(log_value, T(0.5))), T(kIouEps), T(100));
}

template <typename T>
LUCID_HD T probiou_sqrt_arg(T exp_neg_bd) {
  return add(sub(T(1), exp_neg_bd), T(kIouEps));
}

template <typename T>
LUCID_HD T probiou(T gx, T gy, const Gauss<T>& g, T px, T py, const Gauss<T>& p) {
  const auto pre = probiou_pre(gx, gy, g, px, py, p);
  const T bd = probiou_bd(pre.t12, log_(probiou_log_arg(pre.det, sqrt_(pre.q))));
  return sub(T(1), sqrt_(probiou_sqrt_arg(exp_(-bd))));
}

// ---- pose (docs/spec.md, "Pose") ------------------------------------------------------------------------------
// The keypoint scale of an object is its box area times kOksAreaScale, plus the assigner's eps.
constexpr double kOksAreaScale = 0.53;
// Keypoints per object the kernels take: the OKS sums K terms in the order of PyTorch's CUDA reduction over a last
// dimension of K elements, which is the one below for K < 64 (wider rows are split differently).
constexpr int kMaxKeypoints = 63;

// The area of a box x1y1x2y2 as given (no side floor): (x2 - x1) * (y2 - y1).
template <typename T>
LUCID_HD T box_area(T x1, T y1, T x2, T y2) {
  return mul(sub(x2, x1), sub(y2, y1));
}

// The OKS scale of an object from its area: area * 0.53 + eps.
template <typename T>
LUCID_HD T oks_scale(T area, T eps) {
  return add(mul(area, T(kOksAreaScale)), eps);
}

// Step 1's level gate for one anchor: the object's side (sqrt(max(area, 0))) against the bounds lo * t and hi * t of
// the anchor's stride t (each rounded to the strides' dtype); `smallest` and `largest`: t is the smallest (largest)
// stride of all anchors, whose level is open below (above). Comparisons are exact in any type holding both values.
template <typename T>
LUCID_HD bool level_pass(T side, T lo_t, T hi_t, bool smallest, bool largest) {
  return (side >= lo_t || smallest) && (side <= hi_t || largest);
}

// (2 sigma)^2 of one keypoint.
template <typename T>
LUCID_HD T oks_sigma2(T sigma) {
  const T s = mul(T(2), sigma);
  return mul(s, s);
}

// The exponent of one keypoint's OKS term: -d^2 / ((2 sigma)^2 * scale * 2), d^2 = dx^2 + dy^2 between the
// predicted keypoint (px, py) and the object's (gx, gy).
template <typename T>
LUCID_HD T oks_exponent(T px, T py, T gx, T gy, T sigma2, T scale) {
  const T dx = sub(px, gx), dy = sub(py, gy);
  const T d2 = add(mul(dx, dx), mul(dy, dy));
  return div(-d2, mul(mul(sigma2, scale), T(2)));
}

// The sum of the K <= kMaxKeypoints terms term(k) in the order of PyTorch's CUDA sum over a contiguous last dimension
// of K elements: W lanes, W the largest power of two <= K; lane t holds term(t) + term(t + W) (when t + W < K); then
// the lanes are added as a tree, lane t += lane t + o for o = W/2, W/4, ..., 1. The result is lane 0.
template <typename T, typename Term>
LUCID_HD T cuda_order_sum(int K, Term term) {
  T lane[32];
  int W = 1;
  while (W * 2 <= K) W *= 2;
  for (int k = 0; k < K; ++k) {
    const T v = term(k);
    lane[k < W ? k : k - W] = k < W ? v : add(lane[k - W], v);
  }
  for (int o = W / 2; o > 0; o /= 2) {
    for (int t = 0; t < o; ++t) lane[t] = add(lane[t], lane[t + o]);
  }
  return lane[0];
}

// One keypoint's OKS term: exp of its exponent times its visibility (1 when v > 0, else 0; a NaN term stays NaN).
template <typename T>
LUCID_HD T oks_term(T px, T py, T gx, T gy, T visibility, T sigma2, T scale) {
  return mul(exp_(oks_exponent<T>(px, py, gx, gy, sigma2, scale)), visibility > T(0) ? T(1) : T(0));
}

// The OKS of a pair from its sum over the visible keypoints: the mean over the n visible ones (n >= 1).
template <typename T>
LUCID_HD T oks_mean(T sum, int n_visible) {
  return div(sum, T(n_visible));
}

// The overlap that averages two (segmentation: box overlap and mask IoU; pose under rule set 8.4.180: box overlap and
// OKS): (a + b) / 2 in the overlap's dtype.
template <typename T>
LUCID_HD T mean2(T a, T b) {
  return div(add(a, b), T(2));
}

// ---- segmentation (docs/spec.md, "Segmentation") --------------------------------------------------------------
// The pixels [first, end) of a row (or column) of n mask pixels that a crop from lo to hi keeps: pixel i is kept
// when float(i) >= lo and float(i) < hi, the comparisons of the reference (exact for n < 2^24). NaN keeps none.
struct PixelRange {
  int first, end;
};
template <typename T>
LUCID_HD PixelRange crop_range(T lo, T hi, int n) {
  auto first_at_least = [n](T v) -> int {  // the first i with float(i) >= v
    if (!(v > T(0))) return v == v ? 0 : n;
    if (v >= static_cast<T>(n)) return n;
    return static_cast<int>(std::ceil(v));
  };
  const int first = first_at_least(lo);
  int end = hi > T(0) ? first_at_least(hi) : 0;  // the first i with float(i) >= hi (NaN: none kept)
  if (end < first) end = first;
  return {first, end};
}

// Mask pixels (mh * mw) the kernels take: their counts are exact in float32 below 2^24.
constexpr int64_t kMaxMaskPixels = (int64_t{1} << 24) - 1;

// The mask IoU from pixel counts, in float32 as the reference: intersection / max(gt + pred - intersection, 1),
// each count exact in float32 (at most kMaxMaskPixels).
LUCID_HD float mask_iou(int64_t inter, int64_t gt_count, int64_t pred_count) {
  const float i = static_cast<float>(inter);
  float u = sub(add(static_cast<float>(gt_count), static_cast<float>(pred_count)), i);
  if (u < 1.0f) u = 1.0f;
  return div(i, u);
}

}  // namespace geom
}  // namespace lucid
