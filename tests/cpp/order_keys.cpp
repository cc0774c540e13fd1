// Host test of the order keys of csrc/rules.h against rules::ranks_before: the CUDA passes rank by the keys (integer
// atomicMax, radix selection), the CPU passes by ranks_before, so the two backends order alike only if the keys encode
// ranks_before on every class of float. Built and run by tests/test_order_keys.py; prints the failures, exits 1 on any.
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "rules.h"

using lucid::rules::bits_float;
using lucid::rules::float_bits;
using lucid::rules::key_value;
using lucid::rules::kNanKey;
using lucid::rules::kZeroKey;
using lucid::rules::order_key;
using lucid::rules::ranks_before;
using lucid::rules::row_key;
using lucid::rules::row_of_key;
using lucid::rules::value_key_of;

namespace {

int failures = 0;

void fail(const char* what, float v, float w) {
  if (++failures <= 20) std::printf("FAIL %s: v=%a (0x%08x) w=%a (0x%08x)\n", what, v, float_bits(v), w, float_bits(w));
}

// v ranks before w whatever their indices (by value alone), and the two tie (neither ranks before the other).
bool before_by_value(float v, float w) { return ranks_before(v, 0, w, 1) && ranks_before(v, 1, w, 0); }
bool tie(float v, float w) { return !before_by_value(v, w) && !before_by_value(w, v); }

std::vector<float> values() {
  using L = std::numeric_limits<float>;
  std::vector<float> v = {
      L::quiet_NaN(), -L::quiet_NaN(), bits_float(0x7f800001u), bits_float(0xffc01234u),  // NaNs: payloads, signs
      L::infinity(), -L::infinity(), L::max(), -L::max(), 1.0f, -1.0f, 0.5f, -0.5f, 1.0000001f,
      L::min(), -L::min(),                                     // the smallest normals
      L::denorm_min(), -L::denorm_min(), bits_float(0x007fffffu), bits_float(0x807fffffu),  // denormals
      0.0f, -0.0f, 3.0f, 3.0f, -7.25f, -7.25f,                 // zeros and exact ties
  };
  for (uint32_t b = 1; b < 0xFFFFFFFFu - 0x01000193u; b += 0x01000193u) v.push_back(bits_float(b));  // a spread
  return v;
}

}  // namespace

int main() {
  const std::vector<float> vs = values();
  const uint32_t rows[] = {0u, 1u, 7u, 0xFFFFFFFEu};
  for (float v : vs) {
    if (order_key(v) == 0u) fail("key 0 is reserved", v, v);
    if (order_key(key_value(order_key(v))) != order_key(v)) fail("key_value round trip", v, v);
    if (v == v && v != 0.0f && float_bits(key_value(order_key(v))) != float_bits(v)) fail("key_value", v, v);
    for (float w : vs) {
      if ((order_key(v) > order_key(w)) != before_by_value(v, w)) fail("order_key order", v, w);
      if ((order_key(v) == order_key(w)) != tie(v, w)) fail("order_key tie", v, w);
      for (uint32_t r : rows) {
        for (uint32_t s : rows) {
          if (r == s) continue;
          if ((row_key(v, r) > row_key(w, s)) != ranks_before(v, r, w, s)) fail("row_key order", v, w);
          if (row_of_key(row_key(v, r)) != r || value_key_of(row_key(v, r)) != order_key(v))
            fail("row_key parts", v, w);
        }
      }
    }
  }
  if (order_key(0.0f) != kZeroKey || order_key(-0.0f) != kZeroKey) fail("zeros", 0.0f, -0.0f);
  if (key_value(kZeroKey) != 0.0f || key_value(kNanKey) == key_value(kNanKey)) fail("special keys", 0.0f, 0.0f);
  // every float: a nonzero key that round-trips
  uint32_t b = 0;
  do {
    const float v = bits_float(b);
    const uint32_t k = order_key(v);
    if (k == 0u || order_key(key_value(k)) != k) fail("every float", v, v);
  } while (++b != 0u);
  std::printf("%zu values, %d failures\n", vs.size(), failures);
  return failures == 0 ? 0 : 1;
}
