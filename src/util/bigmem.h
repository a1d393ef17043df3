/* Big read-mostly buffers (model weights) in anonymous memory on transparent huge pages.
 *
 * Why: weights are streamed once per token, and on 4 KiB pages every 4 KiB of a stream costs a TLB miss, and
 * the first pass over a file mapping costs a page-table event per page. On the 2-core dev box (flash-2g, OFFICIAL)
 * weights copied to 2 MiB pages decode 46.7 tok/s against 37-39 from the file mapping, and prefill 128 tokens
 * at ~180 tok/s against ~155 (warm) and ~110 (the first pass). */
#ifndef DSV4_UTIL_BIGMEM_H
#define DSV4_UTIL_BIGMEM_H
#include <stddef.h>

/* n bytes (n > 0), 2 MiB aligned, zero-filled on first touch, asked to be backed by huge pages
 * (madvise MADV_HUGEPAGE: the kernel gives them when THP is "always" or "madvise"; else 4 KiB pages, which work the
 * same). NULL when the memory cannot be mapped. */
void *bigmem_alloc(size_t n);
/* Free a buffer of bigmem_alloc(n) (NULL: nothing). */
void bigmem_free(void *p, size_t n);
/* Fill dst[0, n) from fd at offset off with up to `threads` threads reading 64 MiB pieces (one thread cannot
 * fault in and copy a file from the page cache at memory speed). 0, or -1 with errno set (0 when the file ended
 * early: ENODATA). */
int bigmem_pread(void *dst, int fd, size_t off, size_t n, int threads);
#endif
