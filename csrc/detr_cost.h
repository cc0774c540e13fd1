// The DETR matching cost (the peer's RT-DETR matcher's) of one (query, object) pair (docs/spec.md, "DETR matching
// cost"), shared by the CPU and CUDA kernels of torch.ops.lucid.detr_cost. Header-only (c10's float16 and bfloat16
// only), host and device.
//
// The peer computes the cost as a chain of PyTorch operations on float32 tensors; each operation rounds its result.
// This is the same chain, one rounding per operation (geometry.h), in the peer's order:
//   p     = sigmoid(logit of the object's class) = 1 / (1 + exp(-logit))
//   class = alpha * (1 - p)^gamma * -log(p + 1e-8) - (1 - alpha) * p^gamma * -log(1 - p + 1e-8)
//   bbox  = |dx| + |dy| + |dw| + |dh|, the four terms added in `l1_order` (PyTorch's CPU sum adds them in turn,
//           its CUDA sum as (|dx| + |dw|) + (|dy| + |dh|))
//   giou  = 1 - GIoU of the two (cx, cy, w, h) boxes, eps 1e-7
//   cost  = gain_class * class + gain_bbox * bbox + gain_giou * giou; NaN and +-inf set to 0 when `sanitize`.
// x^gamma is PyTorch's pow with a scalar exponent, which multiplies for gamma 2 and 3, takes the square root for 0.5
// and calls powf otherwise. The functions exp, log and powf are the backend's library (CUDA's on the GPU); on the GPU
// the cost equals the peer's bit for bit, on the CPU within the few ulps by which the C library's exp and log differ
// from ATen's vectorised ones.
#pragma once

#include <cstdint>
#include <limits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "geometry.h"

namespace lucid {
namespace detr {

enum L1Order : int {
  kL1Sequential = 0,   // ((dx + dy) + dw) + dh
  kL1Interleaved = 1,  // (dx + dw) + (dy + dh), geometry.h's cuda_order_sum
};

struct CostSettings {
  float gain_class, gain_bbox, gain_giou;
  float alpha, one_minus_alpha;  // alpha and (1 - alpha), each rounded once from the caller's double
  float gamma;
  int l1_order;
  bool sanitize;
};

// The settings as the peer's operations see them: each Python number rounded once to float32, 1 - alpha first
// computed in double.
inline CostSettings make_settings(double gain_class, double gain_bbox, double gain_giou, double alpha, double gamma,
                                  bool sanitize, int l1_order) {
  return {static_cast<float>(gain_class), static_cast<float>(gain_bbox), static_cast<float>(gain_giou),
          static_cast<float>(alpha),      static_cast<float>(1.0 - alpha),  static_cast<float>(gamma),
          l1_order,                       sanitize};
}

// PyTorch's x ** gamma for a float tensor and a scalar exponent.
LUCID_HD float pow_scalar(float x, float gamma) {
  using namespace geom;
  if (gamma == 0.0f) return 1.0f;
  if (gamma == 1.0f) return x;
  if (gamma == 2.0f) return mul(x, x);
  if (gamma == 3.0f) return mul(mul(x, x), x);
  if (gamma == 0.5f) return sqrt_(x);
  return pow_(x, gamma);
}

// The cost of the query with class logit `logit` and box `pd` (cx, cy, w, h) against the object with box `gt`.
LUCID_HD float pair_cost(float logit, const float* pd, const float* gt, const CostSettings& s) {
  using namespace geom;
  const float tiny = static_cast<float>(1e-8), eps = static_cast<float>(1e-7);
  // focal class cost
  const float p = div(1.0f, add(1.0f, exp_(-logit)));
  const float q = sub(1.0f, p);
  const float neg = mul(mul(s.one_minus_alpha, pow_scalar(p, s.gamma)), -log_(add(q, tiny)));
  const float pos = mul(mul(s.alpha, pow_scalar(q, s.gamma)), -log_(add(p, tiny)));
  const float cost_class = sub(pos, neg);
  // L1 distance of the (cx, cy, w, h) vectors
  float d[4];
  for (int k = 0; k < 4; ++k) d[k] = ::fabsf(sub(pd[k], gt[k]));
  const float cost_bbox = s.l1_order == kL1Sequential ? add(add(add(d[0], d[1]), d[2]), d[3])
                                                      : cuda_order_sum<float>(4, [&](int k) { return d[k]; });
  // generalised IoU of the boxes as corners
  const float pw = mul(pd[2], 0.5f), ph = mul(pd[3], 0.5f), gw = mul(gt[2], 0.5f), gh = mul(gt[3], 0.5f);
  const float px1 = sub(pd[0], pw), px2 = add(pd[0], pw), py1 = sub(pd[1], ph), py2 = add(pd[1], ph);
  const float gx1 = sub(gt[0], gw), gx2 = add(gt[0], gw), gy1 = sub(gt[1], gh), gy2 = add(gt[1], gh);
  const float inter = mul(clamp_min(sub(min_(px2, gx2), max_(px1, gx1)), 0.0f),
                          clamp_min(sub(min_(py2, gy2), max_(py1, gy1)), 0.0f));
  const float uni = add(sub(add(mul(pd[2], pd[3]), mul(gt[2], gt[3])), inter), eps);
  const float iou = div(inter, uni);
  const float cw = sub(max_(px2, gx2), min_(px1, gx1)), ch = sub(max_(py2, gy2), min_(py1, gy1));
  const float c_area = add(mul(cw, ch), eps);
  const float cost_giou = sub(1.0f, sub(iou, div(sub(c_area, uni), c_area)));
  const float cost =
      add(add(mul(s.gain_class, cost_class), mul(s.gain_bbox, cost_bbox)), mul(s.gain_giou, cost_giou));
  constexpr float kFloatMax = 3.402823466e+38f;
  if (s.sanitize && !(::fabsf(cost) <= kFloatMax)) return 0.0f;  // NaN or +-inf
  return cost;
}

// The cost of output column j of one query of an image whose objects are the batch's objects [start, start + count)
// (of N: classes `cls`, boxes `gt`), the query's logits `scores` (C classes) and box `pd`: against object j for
// j < count, against the peer's padding (a zero box of class 0) past it. NaN where the object's index falls outside
// [0, N) or its class outside [0, C) (sizes or classes inconsistent with the objects); nothing is read then. Both
// backends' kernels compute every entry with it.
template <typename Score>
LUCID_HD float column_cost(const Score* scores, int64_t C, const float* pd, const float* gt, const int64_t* cls,
                           int64_t N, int64_t start, int64_t count, int64_t j, const CostSettings& s) {
  const float zero_box[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const bool object = j < count;
  const int64_t g = start + j;
  if (object && (g < 0 || g >= N)) return std::numeric_limits<float>::quiet_NaN();
  const int64_t c = object ? cls[g] : 0;
  if (c < 0 || c >= C) return std::numeric_limits<float>::quiet_NaN();
  return pair_cost(static_cast<float>(scores[c]), pd, object ? gt + g * 4 : zero_box, s);
}

// ---- the cost of transformers' DETR-family matchers and of RF-DETR's ---------------------------------------------
// (docs/spec.md, "DETR family cost"). Each family (DETR's softmax, the focal families: Deformable DETR, RT-DETR,
// LW-DETR; RF-DETR's detection cost) builds its cost from the query's class scores and box against the object's class
// and box, as a chain of PyTorch operations; each operation computes in float32 (PyTorch's opmath for float16 and
// bfloat16) and rounds its result to its tensor's dtype. FamilySettings names the dtype of each step (the caller
// reads them off the family's own operations in the call's autocast region); `round_as` is that rounding, round to
// nearest even.

enum DtypeCode : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

enum ClassTerm : int {
  kClassProbability = 0,  // minus the given probability of the object's class (a softmax's, computed by PyTorch)
  kClassFocal = 1,        // the focal terms of sigmoid(logit of the object's class)
  kClassRfdetr = 2,       // RF-DETR's: the focal terms through log-sigmoid, and RF-DETR's boxes (family_cost)
};

LUCID_HD float round_as(float x, int code) {
  if (code == kBFloat16) return static_cast<float>(c10::BFloat16(x));
  if (code == kFloat16) return static_cast<float>(c10::Half(x));
  return x;
}

struct FamilySettings {
  float gain_class, gain_bbox, gain_giou;
  float alpha, one_minus_alpha, gamma;  // each Python number rounded once to float32 (1 - alpha in double first)
  int class_term;                       // ClassTerm
  int l1_order;                         // L1Order of cdist's sum: in turn on the CPU, interleaved on CUDA
  int prob, pow, log, cls;  // DtypeCode of the probabilities, the focal powers, the focal logs, the class term
  int l1, pred_corners, gt_corners, pairs, sum;  // and of the L1, the corners, the pairwise GIoU terms, the first sum
  bool sanitize;                        // NaN and +-inf become `top` (torch.nan_to_num with the dtype's max)
  float top;
};

// The settings as the family's operations see them (each Python number rounded once to float32, 1 - alpha computed in
// double first); dtypes in the order prob, pow, log, cls, l1, pred_corners, gt_corners, pairs, sum.
inline FamilySettings make_family_settings(double gain_class, double gain_bbox, double gain_giou, int64_t class_term,
                                           double alpha, double gamma, int64_t l1_order, const int64_t* dtypes,
                                           bool sanitize, double top) {
  FamilySettings s{};
  s.gain_class = static_cast<float>(gain_class), s.gain_bbox = static_cast<float>(gain_bbox);
  s.gain_giou = static_cast<float>(gain_giou);
  s.alpha = static_cast<float>(alpha), s.one_minus_alpha = static_cast<float>(1.0 - alpha);
  s.gamma = static_cast<float>(gamma);
  s.class_term = static_cast<int>(class_term), s.l1_order = static_cast<int>(l1_order);
  s.prob = static_cast<int>(dtypes[0]), s.pow = static_cast<int>(dtypes[1]);
  s.log = static_cast<int>(dtypes[2]), s.cls = static_cast<int>(dtypes[3]);
  s.l1 = static_cast<int>(dtypes[4]), s.pred_corners = static_cast<int>(dtypes[5]);
  s.gt_corners = static_cast<int>(dtypes[6]), s.pairs = static_cast<int>(dtypes[7]);
  s.sum = static_cast<int>(dtypes[8]);
  s.sanitize = sanitize, s.top = static_cast<float>(top);
  return s;
}

// The focal class term of probability p (dtype s.prob): alpha * (1 - p)^gamma * -log(p + 1e-8) minus
// (1 - alpha) * p^gamma * -log((1 - p) + 1e-8). 1 - p and the additions round to s.prob, the powers and the alpha
// products to s.pow, the logs to s.log (CUDA autocast computes pow and log in float32), the products of the two and
// their difference to s.cls.
LUCID_HD float focal_term(float p, const FamilySettings& s) {
  using namespace geom;
  const int d = s.prob;
  const float tiny = static_cast<float>(1e-8);
  const float q = round_as(sub(1.0f, p), d);
  const float pos = round_as(mul(round_as(mul(s.alpha, round_as(pow_scalar(q, s.gamma), s.pow)), s.pow),
                                 -round_as(log_(round_as(add(p, tiny), d)), s.log)), s.cls);
  const float neg = round_as(mul(round_as(mul(s.one_minus_alpha, round_as(pow_scalar(p, s.gamma), s.pow)), s.pow),
                                 -round_as(log_(round_as(add(q, tiny), d)), s.log)), s.cls);
  return round_as(sub(pos, neg), s.cls);
}

// log(sigmoid(x)) as PyTorch's CUDA kernel computes it: min(0, x) - log1p(exp(-|x|)).
LUCID_HD float log_sigmoid(float x) {
  using namespace geom;
  return sub(x < 0.0f ? x : 0.0f, log1p_(exp_(-::fabsf(x))));
}

// RF-DETR's focal term of a logit x (dtype s.prob): alpha * (1 - p)^gamma * -log_sigmoid(x) minus
// (1 - alpha) * p^gamma * -log_sigmoid(-x), p = sigmoid(x); p and 1 - p round to s.prob, the log-sigmoids to s.log,
// the powers and the alpha products to s.pow, the products of the two and their difference to s.cls.
LUCID_HD float rfdetr_focal_term(float x, const FamilySettings& s) {
  using namespace geom;
  const float p = round_as(div(1.0f, add(1.0f, exp_(-x))), s.prob);
  const float q = round_as(sub(1.0f, p), s.prob);
  const float pos = round_as(mul(round_as(mul(s.alpha, round_as(pow_scalar(q, s.gamma), s.pow)), s.pow),
                                 -round_as(log_sigmoid(x), s.log)), s.cls);
  const float neg = round_as(mul(round_as(mul(s.one_minus_alpha, round_as(pow_scalar(p, s.gamma), s.pow)), s.pow),
                                 -round_as(log_sigmoid(-x), s.log)), s.cls);
  return round_as(sub(pos, neg), s.cls);
}

// The class term of a query's score x for the object's class: minus x (a probability), the focal term of sigmoid(x)
// (sigmoid rounded to s.prob) or RF-DETR's of the logit x, in dtype s.cls.
LUCID_HD float class_term(float x, const FamilySettings& s) {
  using namespace geom;
  if (s.class_term == kClassProbability) return -x;
  if (s.class_term == kClassRfdetr) return rfdetr_focal_term(x, s);
  return focal_term(round_as(div(1.0f, add(1.0f, exp_(-x))), s.prob), s);
}

// (cx, cy, w, h) as corners, transformers' center_to_corners_format in dtype d: (cx - 0.5 * w, cy - 0.5 * h,
// cx + 0.5 * w, cy + 0.5 * h).
LUCID_HD void hf_corners(const float* b, int d, float* c) {
  using namespace geom;
  const float hw = round_as(mul(0.5f, b[2]), d), hh = round_as(mul(0.5f, b[3]), d);
  c[0] = round_as(sub(b[0], hw), d), c[1] = round_as(sub(b[1], hh), d);
  c[2] = round_as(add(b[0], hw), d), c[3] = round_as(add(b[1], hh), d);
}

// transformers' corner check: x2 >= x1 and y2 >= y1 (false for NaN).
LUCID_HD bool hf_corners_valid(const float* c) { return c[2] >= c[0] && c[3] >= c[1]; }

// A family's corners of box b (dtype d): transformers', or RF-DETR's, whose w and h are clamped at 0 first.
LUCID_HD void family_corners(const float* b, int d, const FamilySettings& s, float* c) {
  if (s.class_term != kClassRfdetr) return hf_corners(b, d, c);
  const float clamped[4] = {b[0], b[1], geom::clamp_min(b[2], 0.0f), geom::clamp_min(b[3], 0.0f)};
  hf_corners(clamped, d, c);
}

// Whether the family raises for these corners (transformers' check; RF-DETR checks none).
LUCID_HD bool family_corners_raise(const float* c, const FamilySettings& s) {
  return s.class_term != kClassRfdetr && !hf_corners_valid(c);
}

// Whether a query's box `b` (cx, cy, w, h, of dtype `code`) makes RF-DETR decline the step: a coordinate not finite or
// beyond torch.finfo(dtype).max ** 0.5 / 16 (the doubles below). No value of the dtype lies between that bound and its
// rounding to the dtype, so comparing in double compares as RF-DETR's tensor comparison does.
LUCID_HD bool rfdetr_box_declines(const float* b, int code) {
  const double limit = code == kBFloat16 ? 1.1506675014644243e18 : code == kFloat16 ? 15.996093273046391
                                                                                     : 1.1529214702471081e18;
  for (int k = 0; k < 4; ++k) {
    if (!(::fabs(static_cast<double>(b[k])) <= limit)) return true;
  }
  return false;
}

// Whether a query's box makes the family decline the step (RF-DETR's check of its boxes; transformers' none).
LUCID_HD bool family_query_declines(const float* b, const FamilySettings& s) {
  return s.class_term == kClassRfdetr && rfdetr_box_declines(b, s.pred_corners);
}

// Whether an object's cost `v` makes RF-DETR decline the step (it checks that every cost is finite).
LUCID_HD bool family_entry_declines(float v, const FamilySettings& s) {
  constexpr float kFloatMax = 3.402823466e+38f;
  return s.class_term == kClassRfdetr && !(::fabsf(v) <= kFloatMax);
}

// The family cost of a query (box pd, cx cy w h, as stored) against an object (box gt), given the class term `cls`
// (dtype s.cls):
//   l1   = cdist's |dx| + |dy| + |dw| + |dh| in float32 (order s.l1_order), rounded to s.l1
//   giou = transformers' generalized_box_iou of the corners: areas in float32, the pairwise overlaps and enclosure
//          in s.pairs, union and the ratios in float32; RF-DETR's (kClassRfdetr): its corners (family_corners), the
//          union floored at 1e-7 and the enclosure at 1e-7 (in s.pairs) where they divide
//   cost = (gain_bbox * l1 + gain_class * cls) + gain_giou * -giou, each product in its term's dtype, the first sum in
//          s.sum, the second in float32; with sanitize, NaN and +-inf become s.top.
// Also whether the query's and the object's corners are valid (the family raises where one is not).
LUCID_HD float family_cost(float cls, const float* pd, const float* gt, const FamilySettings& s) {
  using namespace geom;
  float d[4];
  for (int k = 0; k < 4; ++k) d[k] = ::fabsf(sub(pd[k], gt[k]));
  const float l1 = round_as(s.l1_order == kL1Sequential ? add(add(add(d[0], d[1]), d[2]), d[3])
                                                        : cuda_order_sum<float>(4, [&](int k) { return d[k]; }),
                            s.l1);
  float p[4], g[4];
  family_corners(pd, s.pred_corners, s, p);
  family_corners(gt, s.gt_corners, s, g);
  const int r = s.pairs;
  const bool floors = s.class_term == kClassRfdetr;
  const float eps = static_cast<float>(1e-7);
  const float area1 = mul(sub(p[2], p[0]), sub(p[3], p[1])), area2 = mul(sub(g[2], g[0]), sub(g[3], g[1]));
  const float inter = round_as(mul(clamp_min(round_as(sub(min_(p[2], g[2]), max_(p[0], g[0])), r), 0.0f),
                                   clamp_min(round_as(sub(min_(p[3], g[3]), max_(p[1], g[1])), r), 0.0f)),
                               r);
  const float uni = sub(add(area1, area2), inter);
  const float iou = div(inter, floors ? clamp_min(uni, eps) : uni);
  const float area = round_as(mul(clamp_min(round_as(sub(max_(p[2], g[2]), min_(p[0], g[0])), r), 0.0f),
                                  clamp_min(round_as(sub(max_(p[3], g[3]), min_(p[1], g[1])), r), 0.0f)),
                              r);
  // RF-DETR floors the enclosure in its dtype: no value of that dtype lies between 1e-7 and its rounding, so flooring
  // before or after the rounding gives the same
  const float giou = sub(iou, div(sub(area, uni), floors ? round_as(clamp_min(area, eps), r) : area));
  const float first = round_as(add(round_as(mul(s.gain_bbox, l1), s.l1), round_as(mul(s.gain_class, cls), s.cls)),
                               s.sum);
  const float cost = add(first, mul(s.gain_giou, -giou));
  constexpr float kFloatMax = 3.402823466e+38f;
  if (s.sanitize && !(::fabsf(cost) <= kFloatMax)) return s.top;
  return cost;
}

}  // namespace detr
}  // namespace lucid
