// IeeeSubnormals: IEEE arithmetic with subnormals for the span of a call, whatever the caller set.
//
// microscale's bytes are those of IEEE fp32/fp64 arithmetic with subnormals, as in the references.
// A process may have turned on flush-to-zero and denormals-are-zero (x86's MXCSR FTZ and DAZ bits;
// PyTorch's torch.set_flush_denormal(True) does, as may code built with -ffast-math). Products and
// sums in the subnormal range then come out as zero, and blocks whose values lie there encode
// differently (MXFP8 and the NVFP4 reference did, in a test with fp32 subnormal inputs).
//
// The guard clears both bits on the thread that constructs it and puts the caller's back when it
// goes out of scope (only those two bits: exception flags raised meanwhile stay raised). MXCSR is
// per thread, so the public entry points and every OpenMP region's body each hold one.
// Other targets: nothing (NOTE: AArch64's FPCR.FZ is not handled; nothing here could test it).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace microscale {

class IeeeSubnormals {
 public:
  IeeeSubnormals() {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr() & kFlushBits;
    if (saved_ != 0) _mm_setcsr(_mm_getcsr() & ~kFlushBits);
#endif
  }
  ~IeeeSubnormals() {
#if defined(__x86_64__) || defined(__i386__)
    if (saved_ != 0) _mm_setcsr(_mm_getcsr() | saved_);
#endif
  }
  IeeeSubnormals(const IeeeSubnormals&) = delete;
  IeeeSubnormals& operator=(const IeeeSubnormals&) = delete;

 private:
  static constexpr unsigned kFlushBits = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  unsigned saved_ = 0;
};

}  // namespace microscale
