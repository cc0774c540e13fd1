// torch.ops.lucid.assign on the GPU: the steps of docs/spec.md, bit for bit as the reference on CUDA, without any
// (B, M, A) tensor and without host synchronisation (CUDA-graph capturable); assign_pose likewise; assign_seg with
// one synchronisation (below).
//
// Design note. Six launches per call (eight with a second top-k; one more for pose), no memset: the host time of a
// call is mostly its launches. Each launch, its file beside this one, what it reads and what it writes:
//
//   prepare_kernel (prepare.cuh, anchor_index.cuh)
//       block 0: the anchor index, the anchors bucketed by a 64 x 64 grid of cells over their bounding box (A ints,
//       placed through dynamic shared memory). The other blocks: clear the workspace's counters; per object its
//       candidate region (step 1, with the side floor) and per object and prediction the values of its overlaps
//       (step 2): B*M regions + (B*M + B*A) * 3. For pose also the strides (A) and per object its pose values.
//   level_gate_kernel (level_gate.cuh), pose only                                              step 1
//       per object row whether its level gate applies (an anchor inside its region passes it), so that the row
//       kernels below test the gate with the region.
//   candidate_topk_{small,medium,large}_rows_kernel (candidate_topk.cuh, block_select.cuh)       steps 1-3
//       each real object row visits the anchors of the cells under its region, computes overlap and metric of
//       those inside and selects its top K over all A anchors (zero fill). Rows of at most 64 candidates and 512
//       anchors under their cells are done by a warp; others by a block (256, 512 or 1,024 threads: more when
//       there are fewer rows) from a list in shared memory; rows of more than 4,096 candidates by a block with a
//       list in dynamic shared memory. Writes per anchor the claim count and the claimant (integer atomicAdd /
//       atomicMax), per anchor the first row with the largest overlap among all its candidate pairs (atomicMax on
//       a 64-bit key), per row its notes on non-finite metrics.
//   owners_kernel (conflicts.cuh)                                                              step 4
//       per anchor: no claim, background; one claim, its claimant; more, the first row with the largest overlap
//       over all M rows, which step 3 already found: no anchor scans the rows. Writes owner, metric and overlap
//       (B*A, computed again from the row) and per row the maxima and counts of what it owns (integer atomicMax on
//       order-preserving keys), or, with a second top-k, the list of what it owns (B*M*32).
//   second_topk_short_rows_kernel, second_topk_scan_rows_kernel (second_topk.cuh)   step 5, only when K2 != K
//       each row keeps the K2 best of what it owns: `keep` (B*A) and the row maxima.
//   targets_kernel (targets.cuh)                                                               step 6
//       per anchor the outputs; the scores are normalised by the row maxima.
//
// Segmentation (assign_seg) runs the three row kernels with MaskChoicePass first, each row choosing its min(3K, A)
// pairs by box metric plus eps (step 2 of docs/spec.md, "Segmentation") and each image counting its chosen anchors.
// Then (mask_ious below, seg_masks.cuh): the images ordered by their counts (one launch) and the counts copied to
// pinned host memory; while they travel, the chosen anchors' slots, the rows' sorted lists and the objects' mask pixels
// (one launch) and the chosen pairs' crops cut into pieces (one launch); the wait for the copy (the one
// synchronisation: the decode's shapes depend on the counts); and the decode of mask_decode.h: the images' order (that
// of the device, or ATen's argsort when equal positive counts meet at a chunk's end), the prototypes gathered in that
// order (one launch) and the packed coefficients (one launch), then per chunk ATen's batched product (as the reference
// reaches it) and the pixel counts of its pieces (one launch). Step 3 then ranks by the mean of box overlap and mask
// IoU. When a row's chosen pairs and K more fit a warp's list (seg_claims_kernel), the pairs not chosen, whose mask IoU
// is 0, are ranked by the row kernels with UnchosenPass before the decode (launched before the wait, they run while the
// host plans the first product), and one launch after the decode merges each row's chosen pairs with them; else the row
// kernels run again with ClaimPass after the decode. Its buffers: O(B*M*k3 + B*A) in the workspace, the gathered
// prototypes, the packed coefficients and one chunk at a time.
//
// Why memory stays bounded: no buffer is indexed by (row, anchor). Every one is O(B*A + B*M) and all are carved from
// one allocation of the caching allocator on the current stream (workspace.cuh). Integer atomics only; results do
// not depend on the order of threads. Indices into (B, A, C) and (B, M, ...) arrays are 64-bit.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/core/impl/GPUTrace.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "amp.h"
#include "assign_io.h"
#include "checks.h"
#include "cuda/anchor_index.cuh"
#include "cuda/candidate_topk.cuh"
#include "cuda/conflicts.cuh"
#include "cuda/launch.cuh"
#include "cuda/level_gate.cuh"
#include "cuda/prepare.cuh"
#include "cuda/problem.cuh"
#include "cuda/second_topk.cuh"
#include "cuda/seg_masks.cuh"
#include "cuda/targets.cuh"
#include "cuda/workspace.cuh"
#include "entries.h"
#include "mask_decode.h"

namespace lucid {
namespace gpu {
namespace {

// The event that marks the end of the copy of the counts, one per device for each host thread (made once, reused).
cudaEvent_t counts_copied_event() {
  thread_local std::vector<cudaEvent_t> events;
  const auto device = static_cast<size_t>(c10::cuda::current_device());
  if (events.size() <= device) events.resize(device + 1, nullptr);
  if (events[device] == nullptr) C10_CUDA_CHECK(cudaEventCreateWithFlags(&events[device], cudaEventDisableTiming));
  return events[device];
}

// Segmentation, after the choice (seg_masks.cuh): the images' stable order and the per-image counts on their way to
// the host; meanwhile on the device the slots of the chosen anchors, the rows' sorted lists, the objects' mask pixels
// and the chosen pairs' crops and pieces, then what before_decode() launches; the wait for the counts (the one
// synchronisation), the decode (mask_decode.h) and the chosen pairs' pixel counts, as step 2's overlap reads them
// (SegView).
template <typename S, typename T, typename BeforeDecode>
void mask_ious(const SegArgs& seg, const Problem<S, T>& P, const SegChoices& choices, const Workspace<T>& w,
               const at::TensorOptions& opts, cudaStream_t stream, BeforeDecode before_decode) {
  const int64_t B = P.B, A = P.A, M = P.M;
  const int k3 = choices.k3;
  const int mh = static_cast<int>(seg.proto.size(2)), mw = static_cast<int>(seg.proto.size(3));
  // the images by decreasing count, ties by index
  const auto stable = at::empty({B}, opts.dtype(at::kLong));
  order_by_count_kernel<<<blocks_for(B), kThreads, 0, stream>>>(w.seg_per_image, B, stable.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // the counts to the host, through pinned memory (an asynchronous copy, waited for below: the synchronisation,
  // which torch.cuda.set_sync_debug_mode sees as it sees c10::cuda::stream_synchronize; asked before the copy, so
  // that an error it raises leaves no copy in flight)
  if (C10_UNLIKELY(c10::cuda::warning_state().get_sync_debug_mode() != c10::cuda::SyncDebugMode::L_DISABLED)) {
    c10::cuda::warn_or_error_on_sync();
  }
  const auto counts = at::empty({B}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  C10_CUDA_CHECK(cudaMemcpyAsync(counts.data_ptr<int64_t>(), w.seg_per_image, B * sizeof(int64_t),
                                 cudaMemcpyDeviceToHost, stream));
  const cudaEvent_t copied = counts_copied_event();
  C10_CUDA_CHECK(cudaEventRecord(copied, stream));
  // what the decode's counting needs, while the counts travel and the host prepares the decode
  const auto gt = seg.gt_masks.scalar_type() == at::kBool ? seg.gt_masks : seg.gt_masks.ne(0);
  const ChosenRowsArgs rows{w.seg_chosen, w.seg_n, w.seg_anchors, gt.const_data_ptr<bool>(), gt.stride(0),
                            gt.stride(1), gt.stride(2), gt.stride(3), B, A, M, k3, mh, mw, w.seg_slot,
                            w.seg_anchor_of, w.seg_sorted, w.seg_gt_count};
  chosen_rows_kernel<<<blocks_for(chosen_rows_blocks(B, M), 1), kChosenThreads, 0, stream>>>(rows);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // mask_scale (B, 1) or (B,): image b's value at b * stride(0)
  const PieceArgs piece_args{w.seg_n, w.seg_sorted, w.seg_slot, P.pd, seg.mask_scale.const_data_ptr(),
                             seg.mask_scale.stride(0), seg.mask_scale.scalar_type() == at::kDouble, A, M, k3, mh, mw,
                             w.seg_crops, w.seg_pieces, w.seg_piece_n};
  pieces_kernel<<<blocks_for(B, 1), kChosenThreads, 0, stream>>>(piece_args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // what needs no mask IoU (while the counts travel, and while the host prepares the first product)
  before_decode();
  // the wait for the counts
  if (const auto* interp = c10::impl::GPUTrace::get_trace()) {
    (*interp)->trace_gpu_event_synchronization(c10::kCUDA, reinterpret_cast<uintptr_t>(copied));
  }
  C10_CUDA_CHECK(cudaEventSynchronize(copied));
  const MaskCountArgs args{w.seg_piece_n, w.seg_pieces, w.seg_crops, gt.const_data_ptr<bool>(), gt.stride(0),
                           gt.stride(1), gt.stride(2), gt.stride(3), w.seg_counts, M, k3, mh, mw};
  auto pack = [&](at::Tensor& coef, const at::Tensor& order) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, coef.scalar_type(), "seg_pack", [&] {
      const auto& in = seg.pd_coef;
      pack_coef_kernel<scalar_t><<<blocks_for(coef.numel()), kThreads, 0, stream>>>(
          in.const_data_ptr<scalar_t>(), in.stride(0), in.stride(1), in.stride(2), w.seg_anchor_of,
          w.seg_per_image, order.const_data_ptr<int64_t>(), B, A, coef.size(1), coef.size(2),
          coef.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  };
  auto count = [&](const at::Tensor& decoded_in, int64_t start, int64_t stop, const at::Tensor& order) {
    const auto decoded = decoded_in.contiguous();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, decoded.scalar_type(), "seg_count", [&] {
      auto kernel = count_masks_kernel<scalar_t>;
      kernel<<<persistent_grid(kernel, kThreads, 0, std::numeric_limits<int32_t>::max()), kThreads, 0, stream>>>(
          decoded.const_data_ptr<scalar_t>(), decoded.size(1), static_cast<int32_t>(start), static_cast<int32_t>(stop),
          order.const_data_ptr<int64_t>(), args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  };
  // proto[images].flatten(2): 16 bytes a thread when the images are contiguous and a whole number of such units
  auto gather = [&](const at::Tensor& images) {
    const auto& proto = seg.proto;
    const int64_t bytes = proto.stride(0) * static_cast<int64_t>(proto.element_size());
    if (!proto.is_contiguous() || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(proto.const_data_ptr()) % 16 != 0) {
      return gather_images(proto, images);
    }
    auto out = at::empty({images.size(0), proto.size(1), proto.size(2) * proto.size(3)}, proto.options());
    gather_images_kernel<<<blocks_for(images.size(0) * (bytes / 16)), kThreads, 0, stream>>>(
        static_cast<const uint4*>(proto.const_data_ptr()), images.const_data_ptr<int64_t>(), images.size(0),
        bytes / 16, static_cast<uint4*>(out.data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
  };
  // where equal positive counts meet at a chunk's end: the order of at::argsort itself
  auto argsorted = [&] {
    return at::argsort(at::from_blob(w.seg_per_image, {B}, opts.dtype(at::kLong)), /*dim=*/-1, /*descending=*/true);
  };
  decode_chosen_masks(seg, B, counts.const_data_ptr<int64_t>(), stable, argsorted, gather, pack, count);
}

Outputs5 run(const PairDims& d, const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points,
             const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, int64_t topk,
             int64_t topk2, int64_t num_classes, double alpha, double beta, double eps,
             const geom::RuleSet<double>& rule, const PoseArgs* pose_args, const SegArgs* seg_args,
             const AutocastDtype& autocast_dtype) {
  const int64_t B = d.B, A = d.A, C = d.C, M = d.M, D = d.D;
  const c10::cuda::CUDAGuard guard(pd_scores.device());
  // the ATen calls below make working tensors (and the outputs, which never require grad): no autograd or view
  // tracking for them
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  TORCH_CHECK_VALUE(A < std::numeric_limits<int32_t>::max() / 2, "lucid.assign: too many anchors (", A, ")");
  TORCH_CHECK_VALUE(topk < std::numeric_limits<int32_t>::max() && topk2 < std::numeric_limits<int32_t>::max(),
                    "topk and topk2 must fit in 32 bits");
  if (seg_args != nullptr) {  // the pieces of the chosen pairs are indexed in 32 bits (seg_masks.cuh)
    TORCH_CHECK_VALUE(B * M * seg_args->k3 < std::numeric_limits<int32_t>::max() / kMaxPieces,
                      "lucid.assign_seg on CUDA: too many pair slots (B x M x min(3 * topk, A) = ", B, " x ", M, " x ",
                      seg_args->k3, "; at most ", std::numeric_limits<int32_t>::max() / kMaxPieces, ")");
  }
  const auto box_t = gt_bboxes.scalar_type();
  const auto opts = pd_scores.options();
  const auto result = AssignOutputs::make(d, opts, box_t, num_classes, /*zero_scores=*/false);
  if (M == 0 || B * A == 0) return result.tuple();
  const auto stream = at::cuda::getCurrentCUDAStream();
  const bool pow_wide = scores_pow_in_float32(autocast_dtype, c10::DeviceType::CUDA, pd_scores.scalar_type());
  // float32 mask and labels (any strides) are converted by prepare_kernel; others by ATen here
  const bool rows_in_kernel = mask_gt.scalar_type() == at::kFloat && gt_labels.scalar_type() == at::kFloat;
  at::Tensor valid_t, labels_t;
  if (!rows_in_kernel) {
    valid_t = mask_gt.reshape({B, M}).ne(0).contiguous();
    labels_t = gt_labels.reshape({B, M}).to(at::kLong).contiguous();
  }
  const auto scores = pd_scores.contiguous();
  // the anchors (float32, or float16/bfloat16 widened by prepare_kernel) are read once, into the workspace
  // gt_bboxes is read as given (any strides) by prepare_kernel, which copies it to the workspace
  const auto pd = pd_bboxes.contiguous(), anc = anc_points.contiguous();
  TORCH_CHECK_TYPE(box_t == at::kFloat, "lucid.assign on CUDA takes float32 boxes and anchors, got ", box_t,
                   " (the Python API falls back to the reference for other dtypes)");
  // pose: the keypoints and sigmas (float32, checked) contiguous; the predicted keypoints are read in their dtype
  at::Tensor gt_kpts, pd_kpts, sigmas, strides;
  if (pose_args != nullptr) {
    gt_kpts = pose_args->gt_kpts.contiguous();
    pd_kpts = pose_args->pd_kpts.contiguous();
    sigmas = pose_args->sigmas.contiguous();
    strides = pose_args->anc_strides.contiguous();
  }
  {
    using T = float;
    // every working buffer is carved from one allocation; the counters, which must start at zero, come first and
    // are cleared by prepare_kernel
    const bool second = topk2 != topk;
    const bool pose_on = pose_args != nullptr;
    const int64_t k3 = seg_args != nullptr ? seg_args->k3 : 0;
    // segmentation: the claims merged after the decode (seg_claims_kernel) when a row's chosen pairs and K others fit
    // its list; else the row kernels run again after the decode
    const bool merge = seg_args != nullptr && k3 + topk <= kMergeCap;
    const int64_t merge_k = merge ? topk : 0;
    Workspace<T> w;
    Layout probe;
    w.carve(probe, B, A, M, second, D, pose_on, k3, merge_k);
    auto workspace = at::empty({probe.size()}, opts.dtype(at::kByte));
    Layout real{workspace.data_ptr<uint8_t>()};
    w.carve(real, B, A, M, second, D, pose_on, k3, merge_k);
    PoseView pose{};
    if (pose_on) {
      pose = PoseView{true,
                      static_cast<int>(pose_args->K),
                      static_cast<float>(pose_args->level_lo),
                      static_cast<float>(pose_args->level_hi),
                      strides.scalar_type(),
                      w.anc_stride,
                      w.stride_extremes,
                      w.pose_rows,
                      gt_kpts.const_data_ptr<float>(),
                      Float2In{pd_kpts.const_data_ptr(), pd_kpts.scalar_type()},
                      sigmas.const_data_ptr<float>()};
      pose.mean = rule.pose_mean;
    }
    const Regions<T> regions{reinterpret_cast<geom::HbbRegion<T>*>(w.regions),
                             reinterpret_cast<geom::ObbRegion<T>*>(w.regions)};
    // (B, M, k) or (B, M) inputs by their batch, row and last strides (the last is 0 for a 2-d one: k is 0 there)
    auto rows_in = [M](const auto* p, const at::Tensor& t) {
      return RowsIn<std::remove_cv_t<std::remove_pointer_t<decltype(p)>>>{p, M, t.stride(0), t.stride(1),
                                                                          t.dim() == 3 ? t.stride(2) : 0};
    };
    const RowInputs rows =
        rows_in_kernel
            ? RowInputs{rows_in(mask_gt.const_data_ptr<float>(), mask_gt),
                        rows_in(gt_labels.const_data_ptr<float>(), gt_labels), w.valid, w.labels}
            : RowInputs{{}, {}, valid_t.data_ptr<bool>(), labels_t.data_ptr<int64_t>()};
    // the counters, the anchor index (block 0) and the per-box values
    PrepArgs<T> prep{rows_in(gt_bboxes.const_data_ptr<T>(), gt_bboxes), w.gt, rows, pd.data_ptr<T>(),
                           AnchorsIn{anc.const_data_ptr(), anc.scalar_type()},
                           B * M, B * A, A, static_cast<int>(D), geom::rule_as<T>(rule), regions, w.gvals,
                           w.pvals, reinterpret_cast<uint4*>(workspace.data_ptr()), w.zero_words, w.anc,
                           w.cell_of_anchor, w.axes, w.cell_offsets, w.cell_sorted, 0, pose,
                           pose_on ? strides.const_data_ptr() : nullptr, w.anc_stride, w.stride_extremes,
                           static_cast<float>(eps)};
    const auto* props = at::cuda::getCurrentDeviceProperties();
    {
      // the anchor index stages the anchors' places in dynamic shared memory, as many as fit
      auto kernel = prepare_kernel<T>;
      const int64_t room = static_cast<int64_t>(props->sharedMemPerBlockOptin) - static_smem(kernel);
      prep.stage_cap = static_cast<int32_t>(std::max<int64_t>(0, std::min<int64_t>(A, room / 4)));
      const int64_t smem = prep.stage_cap * int64_t{4};
      raise_smem_limit(kernel, smem);
      kernel<<<1 + blocks_for(B * M + B * A, kPrepThreads), kPrepThreads, smem, stream>>>(prep);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const CellIndex cells{w.axes, w.cell_offsets, w.cell_sorted};
    const RowNotes notes{w.nan_seen, w.inf_cand, w.img_flag, M};
    const Claims claims{w.count, w.claimant, A, M};
    const FirstRows first{w.first, A, M};
    const PairLog log{notes, first};
    const OwnerSink sink{w.stats, second ? w.own_n : nullptr, w.own_list};

    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "assign_cuda", [&] {
      using S = scalar_t;
      Problem<S, T> P{{scores.data_ptr<S>(), pd.data_ptr<T>(), w.anc, w.gt, rows.labels, rows.valid, B, A, C, M,
                       alpha, beta, static_cast<T>(eps)},
                      static_cast<int>(D),
                      static_cast<int>(topk),
                      Prep<T>{regions, w.gvals, w.pvals},
                      pow_wide,
                      pose,
                      SegView{}};
      P.classic_ciou = rule.classic_ciou;
      TORCH_CHECK_VALUE(B * M <= std::numeric_limits<int32_t>::max(), "lucid.assign: too many rows");
      if (pose_on && !pose.mean) {  // step 1 for pose: which rows the level gate applies to
        level_gate_kernel<S, T><<<blocks_for(B * M, kWarps), kThreads, 0, stream>>>(P, cells);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      // the row kernels of steps 1-3 with a pass (ClaimPass or MaskChoicePass) and their lists' counters
      auto row_kernels = [&](auto pass, int32_t* medium_n, int32_t* medium_next, int32_t* big_n) {
        using Pass = decltype(pass);
        candidate_topk_small_rows_kernel<S, T, Pass><<<blocks_for(B * M, kWarps), kThreads, 0, stream>>>(
            P, cells, pass, w.medium_rows, medium_n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        {
          // the block per medium row by the number of object rows: larger when they are fewer (the longest row's
          // latency is then the kernel's time)
          auto launch = [&](auto kernel, int threads) {
            kernel<<<persistent_grid(kernel, threads, 0, B * M), threads, 0, stream>>>(
                P, cells, pass, w.medium_rows, medium_n, medium_next, w.big_rows, big_n);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          };
          const int64_t per_sm = (B * M + props->multiProcessorCount - 1) / props->multiProcessorCount;
          if (per_sm <= kFewRows) {
            launch(candidate_topk_medium_rows_kernel<kMediumFewThreads, S, T, Pass>, kMediumFewThreads);
          } else if (per_sm <= kMidRows) {
            launch(candidate_topk_medium_rows_kernel<kMediumMidThreads, S, T, Pass>, kMediumMidThreads);
          } else {
            launch(candidate_topk_medium_rows_kernel<kThreads, S, T, Pass>, kThreads);
          }
        }
        {
          auto kernel = candidate_topk_large_rows_kernel<S, T, Pass>;
          const int64_t avail = static_cast<int64_t>(props->sharedMemPerBlockOptin) - static_smem(kernel);
          // cap: the (key, anchor) pairs that fit next to the bitmap; -1 when not even the bitmap fits (then every
          // large row takes the recompute path)
          const int64_t room = avail - big_row_smem(A, 0);
          const int64_t cap = room < 0 ? -1 : std::min<int64_t>(A, room / 8);
          const int64_t smem = cap < 0 ? 0 : big_row_smem(A, cap);
          raise_smem_limit(kernel, smem);
          kernel<<<persistent_grid(kernel, kBigThreads, smem, B * M), kBigThreads, smem, stream>>>(
              P, cells, pass, w.big_rows, big_n, cap);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      };
      const UnchosenTop top{w.seg_top_n, w.seg_top_anchor, w.seg_top_key, static_cast<int>(topk)};
      if (seg_args != nullptr) {  // step 2 for segmentation: the chosen pairs and their mask IoUs
        const SegChoices choices{w.seg_n, w.seg_anchors, w.seg_chosen, w.seg_per_image, A, M, static_cast<int>(k3)};
        row_kernels(MaskChoicePass<S, T>{choices, static_cast<int>(k3)}, w.seg_medium_n, w.seg_medium_next,
                    w.seg_big_n);
        // the view of the mask IoUs (filled by the decode): the pairs not chosen read 0 from it before
        P.seg = SegView{true, static_cast<int>(k3), w.seg_n, w.seg_sorted, w.seg_counts, w.seg_gt_count};
        // with the merge, step 3 of the pairs not chosen runs before the decode: the device would otherwise wait
        // there for the host, which plans the first product
        mask_ious(*seg_args, P, choices, w, opts, stream, [&] {
          if (merge) row_kernels(UnchosenPass<S, T>{log, top, static_cast<int>(topk)}, w.medium_n, w.medium_next,
                                 w.big_n);
        });
      }
      // steps 1-3: the claims, and the per-anchor claim counts
      if (merge) {
        seg_claims_kernel<S, T><<<blocks_for(B * M, kWarps), kThreads, 0, stream>>>(P, log, claims, top);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      } else {
        row_kernels(ClaimPass<S, T>{log, claims, static_cast<int>(topk)}, w.medium_n, w.medium_next, w.big_n);
      }
      // step 4: the owners
      owners_kernel<S, T><<<blocks_for(B * A), kThreads, 0, stream>>>(P, claims, first, sink, w.owner, w.own_align,
                                                                     w.own_ov);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (second) {
        // step 5
        second_topk_short_rows_kernel<S, T><<<blocks_for(B * M, kWarps), kThreads, 0, stream>>>(
            P, notes, w.own_n, w.own_list, w.own_align, w.own_ov, static_cast<int>(topk2), w.keep, w.stats,
            w.slow_rows, w.slow_n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        auto kernel = second_topk_scan_rows_kernel<S, T>;
        kernel<<<persistent_grid(kernel, kThreads, 0, B * M), kThreads, 0, stream>>>(
            P, notes, w.owner, w.own_align, w.own_ov, static_cast<int>(topk2), w.keep, w.stats, w.slow_rows,
            w.slow_n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
    // step 6: the targets
    const TargetArgs<T> out{w.owner, second ? w.keep : nullptr, w.own_align, w.stats, notes, rows.labels,
                            w.gt, B, M, A, C, static_cast<int>(D), static_cast<T>(eps),
                            result.labels.data_ptr<int64_t>(), result.boxes.data_ptr<T>(),
                            result.scores.data_ptr<T>(), result.fg.data_ptr<bool>(), result.gt_idx.data_ptr<int64_t>()};
    if (C < std::numeric_limits<int32_t>::max() / kThreads) {  // 32-bit index math within a block's scores
      targets_kernel<T, int32_t><<<blocks_for(B * A), kThreads, 0, stream>>>(out);
    } else {
      targets_kernel<T, int64_t><<<blocks_for(B * A), kThreads, 0, stream>>>(out);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return result.tuple();
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { Entries<run>::register_in(m); }

}  // namespace gpu
}  // namespace lucid

