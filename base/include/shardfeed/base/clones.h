// SF_CLONES: compile a function twice, for AVX2 CPUs (x86-64-v3: AVX2, FMA, F16C, BMI2) and for
// the x86-64 baseline; the dynamic loader picks one per process by what the CPU supports.
//
// An ISA level, not "arch=haswell": GCC resolves an arch= clone with __builtin_cpu_is, true only
// on that exact CPU family, so a Skylake, an EPYC or a virtual "Xeon" would run the baseline.
// Off (plain functions) where the resolvers cannot run: non-x86 or non-GNU compilers, and
// ThreadSanitizer builds (SHARDFEED_NO_CLONES: the resolvers run during relocation, before
// TSan's runtime is up). Header-only; no state.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(SHARDFEED_NO_CLONES)
#define SF_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SF_CLONES
#endif
