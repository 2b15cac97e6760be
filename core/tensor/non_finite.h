// The non-finite scan both sides run on gradients and imported values.
#pragma once

#include <cstddef>

#include "absl/types/span.h"

namespace pscluster::core {

// Index of the first NaN/Inf in `values`, or values.size() when all are finite. Scans in
// vectorisable blocks (integer exponent test), so it runs near memory bandwidth.
size_t FirstNonFinite(absl::Span<const float> values);

// The largest |value| in `values` (0 when empty), or +Inf when any value is Inf or NaN
// (FirstNonFinite then says where). One vectorisable integer pass: for IEEE floats without
// their sign bit, integer order is magnitude order, and Inf/NaN sort above every finite.
float MaxAbs(absl::Span<const float> values);

// sum[i] += add[i] for every i (add.size() == sum.size()), returning MaxAbs of the new sum
// from the same pass.
float AddAndMaxAbs(absl::Span<float> sum, absl::Span<const float> add);

}  // namespace pscluster::core
