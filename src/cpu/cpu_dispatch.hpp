// MICROSCALE_CPU_DISPATCH: compiles a hot function for AVX-512 (x86-64-v4), AVX2 (x86-64-v3) and
// baseline x86-64, and lets the loader pick one for the CPU at hand (GCC target_clones, an ifunc
// resolved once per process): dispatch happens once, never per element. The code is the same C++
// in each clone and uses no fast-math, so every clone computes the same bytes; the tests run the
// clone of the machine they run on. Other compilers and targets get the plain function.
//
// A build may define MICROSCALE_CPU_DISPATCH itself (empty, with -march=x86-64-v3 say) to get one
// clone only: that is how the AVX2 clone is measured on an AVX-512 machine (docs/perf.md).
#pragma once

#ifdef MICROSCALE_CPU_DISPATCH
// Set by the build.
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define MICROSCALE_CPU_DISPATCH __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MICROSCALE_CPU_DISPATCH
#endif

// For helpers of a MICROSCALE_CPU_DISPATCH function: a function it calls out of line is compiled
// for baseline x86-64 only (no clones), whatever clone calls it; inlined, it is compiled with the
// clone. (GCC 12 left a row loop of the portable MX kernel out of line.)
#define MICROSCALE_CPU_INLINE __attribute__((always_inline)) inline
