// The branch-free encoders of the CPU fast path live in core/element_codec.hpp, shared with the
// CUDA backend; this header keeps their CPU-side names.
#pragma once

#include "core/element_codec.hpp"

namespace microscale::cpu {

using microscale::E2M1Codec;
using microscale::E2M3Codec;
using microscale::E3M2Codec;
using microscale::E4M3Codec;
using microscale::E5M2Codec;
using microscale::ElementCodec;

}  // namespace microscale::cpu
