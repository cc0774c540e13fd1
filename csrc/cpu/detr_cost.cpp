// torch.ops.lucid.detr_cost on the CPU (docs/spec.md, "DETR matching cost"): detr_cost.h's column cost for every
// (image, query, column), the images' rows as parallel tasks; and its family and class_terms overloads (below).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "detr_cost.h"

namespace lucid {
namespace cpu {
namespace {

at::Tensor detr_cost_cpu(const at::Tensor& pred_bboxes, const at::Tensor& pred_scores, const at::Tensor& gt_bboxes,
                         const at::Tensor& gt_cls, const at::Tensor& sizes, int64_t width, c10::ArrayRef<double> gains,
                         double alpha, double gamma, bool sanitize, int64_t l1_order) {
  const DetrCostDims d =
      check_detr_cost_args(pred_bboxes, pred_scores, gt_bboxes, gt_cls, sizes, width, gains, gamma, l1_order);
  const auto s = detr::make_settings(gains[0], gains[1], gains[2], alpha, gamma, sanitize, static_cast<int>(l1_order));
  auto out = at::empty({d.B, d.Q, d.W}, pred_scores.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  const auto scores = pred_scores.to(at::kFloat).contiguous(), pd = pred_bboxes.to(at::kFloat).contiguous();
  const auto gt = gt_bboxes.to(at::kFloat).contiguous();
  const auto cls = gt_cls.to(at::kLong).contiguous(), n = sizes.to(at::kLong).contiguous();
  const float* s_ptr = scores.data_ptr<float>();
  const float* pd_ptr = pd.data_ptr<float>();
  const float* gt_ptr = gt.data_ptr<float>();
  const int64_t* cls_ptr = cls.data_ptr<int64_t>();
  const int64_t* n_ptr = n.data_ptr<int64_t>();
  float* o_ptr = out.data_ptr<float>();
  std::vector<int64_t> start(d.B);
  for (int64_t b = 0, total = 0; b < d.B; total += n_ptr[b], ++b) start[b] = total;
  at::parallel_for(0, d.B * d.Q, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / d.Q;
      for (int64_t j = 0; j < d.W; ++j) {
        o_ptr[row * d.W + j] =
            detr::column_cost(s_ptr + row * d.C, d.C, pd_ptr + row * 4, gt_ptr, cls_ptr, d.N, start[b], n_ptr[b], j, s);
      }
    }
  });
  return out;
}

// detr_cost.h's family_cost of every (layer, image, query, column) of one (L, B, Q, .) stack into out (its L * B * Q
// rows of W), the rows as parallel tasks; the class term is class_cost's entry where it is defined (the family's own,
// whose math functions are ATen's vectorised ones), else detr_cost.h's class_term of the scores (the C library's).
// Returns whether some query's or object's corners are invalid, or for RF-DETR some query's box or object's cost
// fails its checks.
bool fill_family_cost(const at::Tensor& scores, const at::Tensor& boxes, const at::Tensor& labels,
                      const at::Tensor& objects, const at::Tensor& sizes, const FamilyCostDims& d,
                      const detr::FamilySettings& s, const at::Tensor& class_cost, float* out_ptr) {
  const auto bx = boxes.to(at::kFloat).contiguous(), obj = objects.to(at::kFloat).contiguous();
  const auto lab = labels.to(at::kLong).contiguous(), n = sizes.to(at::kLong).contiguous();
  const at::Tensor cc = class_cost.defined() ? class_cost.to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor sc = cc.defined() ? at::Tensor() : scores.to(at::kFloat).contiguous();  // read only without cc
  const float* s_ptr = sc.defined() ? sc.data_ptr<float>() : nullptr;
  const float* b_ptr = bx.data_ptr<float>();
  const float* o_ptr = obj.data_ptr<float>();
  const int64_t* l_ptr = lab.data_ptr<int64_t>();
  const int64_t* n_ptr = n.data_ptr<int64_t>();
  const float* c_ptr = cc.defined() ? cc.data_ptr<float>() : nullptr;
  std::vector<int64_t> start(d.B);
  for (int64_t b = 0, total = 0; b < d.B; total += n_ptr[b], ++b) start[b] = total;
  bool bad = false;
  for (int64_t k = 0; k < d.N && !bad; ++k) {
    float c[4];
    detr::family_corners(o_ptr + k * 4, s.gt_corners, s, c);
    bad = detr::family_corners_raise(c, s);
  }
  std::atomic<bool> bad_query{false};
  // out is (L, B, Q, W) in memory: problem (l, b, g)'s row i is query g * Q / groups + i of image b in layer l
  at::parallel_for(0, d.L * d.B * d.Q, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = (row / d.Q) % d.B;
      const float* pd = b_ptr + row * 4;
      float c[4];
      detr::family_corners(pd, s.pred_corners, s, c);
      if (detr::family_corners_raise(c, s) || detr::family_query_declines(pd, s)) {
        bad_query.store(true, std::memory_order_relaxed);
      }
      for (int64_t j = 0; j < d.W; ++j) {
        float v = 0.0f;
        if (j < n_ptr[b]) {
          const int64_t k = start[b] + j, cls = l_ptr[k];
          if (cls < 0 || cls >= d.C) {
            v = std::numeric_limits<float>::quiet_NaN();
          } else {
            const float term = c_ptr != nullptr ? c_ptr[row * d.W + j] : detr::class_term(s_ptr[row * d.C + cls], s);
            v = detr::family_cost(term, pd, o_ptr + k * 4, s);
          }
          if (detr::family_entry_declines(v, s)) bad_query.store(true, std::memory_order_relaxed);
        }
        out_ptr[row * d.W + j] = v;
      }
    }
  });
  return bad || bad_query.load();
}

// torch.ops.lucid.detr_cost.family on the CPU: fill_family_cost of the one stack.
std::tuple<at::Tensor, at::Tensor> detr_family_cost_cpu(
    const at::Tensor& scores, const at::Tensor& boxes, const at::Tensor& labels, const at::Tensor& objects,
    const at::Tensor& sizes, int64_t width, int64_t groups, c10::ArrayRef<double> gains, int64_t class_term,
    double alpha, double gamma, int64_t l1_order, c10::ArrayRef<int64_t> dtypes, bool sanitize, double top,
    const c10::optional<at::Tensor>& class_cost) {
  const FamilyCostDims d = check_family_cost_args(scores, boxes, labels, objects, sizes, width, groups, gains,
                                                  class_term, gamma, l1_order, dtypes, class_cost);
  const auto s = detr::make_family_settings(gains[0], gains[1], gains[2], class_term, alpha, gamma, l1_order,
                                            dtypes.data(), sanitize, top);
  auto out = at::empty({d.L * d.B * d.G, d.Q / d.G, d.W}, scores.options().dtype(at::kFloat));
  auto invalid = at::zeros({1}, scores.options().dtype(at::kInt));
  if (fill_family_cost(scores, boxes, labels, objects, sizes, d, s, class_cost.value_or(at::Tensor()),
                       out.data_ptr<float>())) {
    invalid.fill_(1);
  }
  return {out, invalid};
}

// The focal terms (positive, negative) of probabilities p, as the families' Python computes them: each operation
// ATen's own, in their order, with Python's scalars (1 - alpha, 1e-8).
std::pair<at::Tensor, at::Tensor> focal_terms(const at::Tensor& p, double alpha, double gamma) {
  auto neg = at::mul(at::mul(at::pow(p, gamma), 1.0 - alpha), at::neg(at::log(at::add(at::rsub(p, 1), 1e-8))));
  auto pos = at::mul(at::mul(at::pow(at::rsub(p, 1), gamma), alpha), at::neg(at::log(at::add(p, 1e-8))));
  return {pos, neg};
}

// RF-DETR's focal terms of logits already gathered at the objects' classes, each operation ATen's own, in RF-DETR's
// order, with its Python scalars (1 - alpha, alpha): through log-sigmoid, and p^gamma as pow.
at::Tensor rfdetr_focal_terms(const at::Tensor& x, double alpha, double gamma) {
  const auto p = at::sigmoid(x);
  const auto neg = at::mul(at::mul(at::pow(p, gamma), 1.0 - alpha), at::neg(at::log_sigmoid(at::neg(x))));
  const auto pos = at::mul(at::mul(at::pow(at::rsub(p, 1), gamma), alpha), at::neg(at::log_sigmoid(x)));
  return at::sub(pos, neg);
}

// torch.ops.lucid.detr_cost.class_terms (CPU): the class terms of transformers' DETR families and RF-DETR
// (docs/spec.md, "DETR family cost"), every layer's (B, Q, width) with the family's own ATen operations on the
// family's own tensors, so that each element is rounded where the family's vectorised CPU kernels round it: kind 0
// minus the softmax probability of the object's class; 1 the focal terms of every class, then the object's taken; 2
// the object's probability taken, then its focal terms (each on its layer's own (B * Q, C) tensor); 3 RF-DETR's focal
// terms of the logits gathered at the objects' classes, every layer at once (its stacked (L * B, Q, width) tensor); 4
// RF-DETR's focal terms as its forward computes them over the cross product: each layer's logits gathered at every
// object's class (its (B * Q, N) tensor), each image's block taken from it. labels (N,) are the batch's objects'
// classes image after image, sizes (B,) their counts; columns past an image's objects take class 0 (as the family's
// padded blocks), 0 for kind 4 (the cross product has none). One call from Python.
at::Tensor detr_class_terms_cpu(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& sizes,
                                int64_t width, int64_t kind, double alpha, double gamma) {
  const at::NoGradGuard no_grad;  // the op's result is a constant (ops.cpp): its operations record no graph
  TORCH_CHECK_VALUE(logits.dim() == 4 && logits.size(0) >= 1, "logits must be (L, B, Q, C) with L >= 1, got ",
                    logits.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(logits.scalar_type()), "logits must be floating point, got ",
                   logits.scalar_type());
  TORCH_CHECK_VALUE(labels.dim() == 1, "labels must be (N,), got ", labels.sizes());
  TORCH_CHECK_TYPE(labels.scalar_type() == at::kLong, "labels must be int64, got ", labels.scalar_type());
  TORCH_CHECK_VALUE(sizes.dim() == 1 && sizes.size(0) == logits.size(1), "sizes must be (B,) with B = ",
                    logits.size(1), " (logits' images), got ", sizes.sizes());
  TORCH_CHECK_TYPE(sizes.scalar_type() == at::kLong, "sizes must be int64, got ", sizes.scalar_type());
  TORCH_CHECK_VALUE(kind >= 0 && kind <= 4, "kind must be 0 (softmax), 1 (focal), 2 (focal of the object's "
                    "probability), 3 (RF-DETR's) or 4 (RF-DETR's over the cross product), got ", kind);
  TORCH_CHECK_VALUE(labels.device() == logits.device() && sizes.device() == logits.device(),
                    "logits, labels and sizes must be on one device, got ", logits.device(), ", ", labels.device(),
                    " and ", sizes.device());
  const int64_t layers = logits.size(0), bs = logits.size(1), nq = logits.size(2), nc = logits.size(3);
  const auto n = sizes.contiguous();
  const int64_t* n_ptr = n.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t b = 0; b < bs; ++b) {
    TORCH_CHECK_VALUE(n_ptr[b] >= 0 && n_ptr[b] <= width, "sizes must be in [0, width = ", width, "], got ", n_ptr[b],
                      " for image ", b);
    total += n_ptr[b];
  }
  TORCH_CHECK_VALUE(total == labels.size(0), "sizes must add up to labels' ", labels.size(0), " objects, got ", total);
  auto padded = at::zeros({bs, width}, labels.options());
  for (int64_t b = 0, start = 0; b < bs; start += n_ptr[b], ++b) {
    padded.select(0, b).narrow(0, 0, n_ptr[b]).copy_(labels.narrow(0, start, n_ptr[b]));
  }
  if (kind == 3) {
    const auto index = padded.repeat({layers, 1}).unsqueeze(1).expand({layers * bs, nq, width});
    const auto gathered = at::gather(logits.reshape({layers * bs, nq, nc}), 2, index);
    return rfdetr_focal_terms(gathered, alpha, gamma).view({layers, bs, nq, width});
  }
  if (kind == 4) {
    at::Tensor out;
    for (int64_t k = 0; k < layers; ++k) {
      const auto cross = rfdetr_focal_terms(logits.select(0, k).flatten(0, 1).index_select(1, labels), alpha, gamma);
      if (k == 0) out = at::zeros({layers, bs, nq, width}, cross.options());  // the terms' dtype in the call's region
      for (int64_t b = 0, start = 0; b < bs; start += n_ptr[b], ++b) {
        out.select(0, k).select(0, b).narrow(1, 0, n_ptr[b]).copy_(
            cross.narrow(0, b * nq, nq).narrow(1, start, n_ptr[b]));
      }
    }
    return out;
  }
  const auto index = padded.unsqueeze(1).expand({bs, nq, width});
  std::vector<at::Tensor> terms;
  terms.reserve(layers);
  for (int64_t k = 0; k < layers; ++k) {
    const auto flat = logits.select(0, k).flatten(0, 1);
    if (kind == 0) {
      terms.push_back(at::neg(flat.softmax(-1).view({bs, nq, nc}).gather(2, index)));
    } else if (kind == 1) {
      const auto [pos, neg] = focal_terms(flat.sigmoid(), alpha, gamma);
      terms.push_back(at::sub(pos.view({bs, nq, nc}).gather(2, index), neg.view({bs, nq, nc}).gather(2, index)));
    } else {
      const auto [pos, neg] = focal_terms(at::sigmoid(flat).view({bs, nq, nc}).gather(2, index), alpha, gamma);
      terms.push_back(at::sub(pos, neg));
    }
  }
  return at::stack(terms);
}

// torch.ops.lucid.detr_cost.parts on the CPU: each part's class terms by detr_class_terms_cpu (the family's own ATen
// operations on the part's own layers), then fill_family_cost of the part into its rows of the one result.
std::tuple<at::Tensor, at::Tensor> detr_family_parts_cpu(
    at::TensorList score_parts, at::TensorList box_parts, const at::Tensor& labels, const at::Tensor& objects,
    const at::Tensor& sizes, int64_t width, int64_t groups, c10::ArrayRef<double> gains, int64_t class_kind,
    double alpha, double gamma, int64_t l1_order, c10::ArrayRef<int64_t> dtypes, bool sanitize, double top) {
  const auto score_stacks = parts_as_stacks(score_parts), box_stacks = parts_as_stacks(box_parts);
  const at::TensorList scores(score_stacks), boxes(box_stacks);
  const auto dims = check_family_parts_args(scores, boxes, labels, objects, sizes, width, groups, gains, class_kind,
                                            gamma, l1_order, dtypes);
  int64_t layers = 0;
  for (const auto& d : dims) layers += d.L;
  const FamilyCostDims& d0 = dims[0];
  auto out = at::empty({layers * d0.B * d0.G, d0.Q / d0.G, d0.W}, scores[0].options().dtype(at::kFloat));
  auto invalid = at::zeros({1}, scores[0].options().dtype(at::kInt));
  const auto lab = labels.to(at::kLong), n = sizes.to(at::kLong);
  float* out_ptr = out.data_ptr<float>();
  bool bad = false;
  for (size_t p = 0; p < dims.size(); ++p) {
    const auto& d = dims[p];
    const auto s = detr::make_family_settings(gains[0], gains[1], gains[2], parts_class_term(class_kind), alpha, gamma,
                                              l1_order, dtypes.data() + 9 * p, sanitize, top);
    // the class terms of the objects' classes (one outside [0, C) costs NaN below, its term unread)
    at::Tensor terms;
    if (d.C > 0 && d.N > 0) {
      const auto classes = lab.clamp(0, d.C - 1);
      // RF-DETR's cost as each layer's forward computes it: where the boxes' dtype is the objects', the compact cost
      // of each layer alone (kind 3: each element at its place in that forward, so rounded as there); else over the
      // cross product (kind 4, a layer at a time already)
      if (class_kind == 4 && boxes[p].scalar_type() == objects.scalar_type()) {
        std::vector<at::Tensor> layers_terms;
        for (int64_t k = 0; k < d.L; ++k) {
          layers_terms.push_back(
              detr_class_terms_cpu(scores[p].narrow(0, k, 1), classes, n, width, 3, alpha, gamma).squeeze(0));
        }
        terms = at::stack(layers_terms);
      } else {
        terms = detr_class_terms_cpu(scores[p], classes, n, width, class_kind, alpha, gamma);
      }
    }
    bad |= fill_family_cost(scores[p], boxes[p], lab, objects, n, d, s, terms, out_ptr);
    out_ptr += d.L * d.B * d.Q * d.W;
  }
  if (bad) invalid.fill_(1);
  return {out, invalid};
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) {
  m.impl("detr_cost", &detr_cost_cpu);
  m.impl("detr_cost.family", &detr_family_cost_cpu);
  m.impl("detr_cost.class_terms", &detr_class_terms_cpu);
  m.impl("detr_cost.parts", &detr_family_parts_cpu);
}

}  // namespace cpu
}  // namespace lucid
