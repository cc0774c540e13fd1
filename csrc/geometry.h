// Box geometry shared by the CPU and CUDA kernels. Torch-free, header-only, host and device.
//
// Every function here follows SPEC.md step by step, as a chain of separately rounded operations in the same order as
// the pure-PyTorch reference (lucid_assign/reference.py). On the device the rounding of each step is made explicit
// with __f*_rn / __d*_rn intrinsics so that nvcc can never fuse a multiply and an add that the reference rounds apart;
// the host build uses -ffp-contract=off for the same reason.
//
// Trigonometric values of the box angles are inputs rather than computed here: the reference takes them from
// PyTorch's own math library on each device (CUDA's cosf/sinf on the GPU, ATen's vectorised functions on the CPU),
// and each backend passes in values from that same library.
#pragma once

#if defined(__CUDACC__)
#define LUCID_HD __host__ __device__ __forceinline__
#else
#define LUCID_HD inline
#endif

namespace lucid {
namespace geom {

// ---- separately rounded arithmetic ----------------------------------------------------------------------------
LUCID_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LUCID_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LUCID_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LUCID_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
LUCID_HD double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
LUCID_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// ---- candidate regions (SPEC step 1) ----------------------------------------------------------------------------
// The containment threshold of the axis-aligned test: strict, with a margin of 1e-9 in the box's precision.
template <typename T>
LUCID_HD T hbb_margin() {
  return T(1e-9);
}

// Axis-aligned candidate region: x1 y1 x2 y2 after the centre/size round trip and the small-target side floor.
template <typename T>
struct HbbRegion {
  T x1, y1, x2, y2;
};

// box: x1 y1 x2 y2. valid: the row is a real object (padding rows are not floored). Halving is exact, so x/2 and
// x*0.5 give the same bits, which is what both reference devices compute.
template <typename T>
LUCID_HD HbbRegion<T> hbb_candidate_region(T x1, T y1, T x2, T y2, bool valid, T stride_val) {
  const T half = T(0.5);
  const T cx = mul(add(x1, x2), half);
  const T cy = mul(add(y1, y2), half);
  T w = sub(x2, x1);
  T h = sub(y2, y1);
  if (valid && w < stride_val) w = stride_val;
  if (valid && h < stride_val) h = stride_val;
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
LUCID_HD ObbRegion<T> obb_candidate_region(T cx, T cy, T w, T h, T cos_t, T sin_t, bool valid, T stride_val) {
  const T half = T(0.5);
  if (valid && w < stride_val) w = stride_val;
  if (valid && h < stride_val) h = stride_val;
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

}  // namespace geom
}  // namespace lucid
