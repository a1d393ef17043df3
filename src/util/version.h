/* What this build is: the library version (dsv4_version() in dsv4.h), the git commit it was built from and the
 * options it was built with. Baked in at build time (the Makefile writes $(BUILD)/gen/build_info.h), so a bug
 * report or a saved state file can name the exact build that produced it. */
#ifndef DSV4_UTIL_VERSION_H
#define DSV4_UTIL_VERSION_H

/* The git commit (12 hex digits, "-dirty" when the tree had uncommitted changes), or "unknown" outside git. */
const char *dsv4_build_commit(void);

/* One line of build options: "cuda no; cpu avx2 fma f16c; gcc 12.2.0" (CPU features are the ones the compiler
 * was allowed to use, i.e. what the kernels were compiled for, not what the running machine has). */
const char *dsv4_build_options(void);

/* "dsv4 0.1.0 (commit 0123456789ab)": what state files record as their writer. At most 47 characters. */
const char *dsv4_build_writer(void);
#endif
