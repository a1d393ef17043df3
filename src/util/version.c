/* Version and build identification (util/version.h). The commit comes from the generated build_info.h, so that
 * only this file is recompiled when it changes; the rest from the compiler's macros. */
#include "dsv4.h"
#include "util/version.h"
#include "build_info.h"

#ifndef DSV4_BUILD_COMMIT
#define DSV4_BUILD_COMMIT "unknown"
#endif

/* The instruction-set extensions the build's baseline allows (-march). The fp32 kernels of src/backend/cpu/isa/
 * are compiled for each set and chosen at run time (isa.h); `dsv4 --version` adds those. */
#if defined(__x86_64__) || defined(__i386__)
#define CPU_ARCH "x86-64"
#else
#define CPU_ARCH "generic"
#endif
#ifdef __AVX2__
#define F_AVX2 " avx2"
#else
#define F_AVX2 ""
#endif
#ifdef __FMA__
#define F_FMA " fma"
#else
#define F_FMA ""
#endif
#ifdef __F16C__
#define F_F16C " f16c"
#else
#define F_F16C ""
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define F_AVX512 " avx512f avx512bw"
#else
#define F_AVX512 ""
#endif
#ifdef __clang__
#define COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define COMPILER "gcc " __VERSION__
#else
#define COMPILER "unknown compiler"
#endif

const char *dsv4_version(void) { return DSV4_VERSION; }

const char *dsv4_build_commit(void) { return DSV4_BUILD_COMMIT; }

#ifdef DSV4_CUDA   /* set by make CUDA=1 for every C file */
#define CUDA_OPT "cuda yes"
#else
#define CUDA_OPT "cuda no"
#endif

const char *dsv4_build_options(void) { return CUDA_OPT "; cpu " CPU_ARCH F_AVX2 F_FMA F_F16C F_AVX512 "; " COMPILER; }

const char *dsv4_build_writer(void) { return "dsv4 " DSV4_VERSION " (commit " DSV4_BUILD_COMMIT ")"; }
