#!/usr/bin/env bash
# Every CUDA kernel begins with dev_grid_wait() (src/backend/cuda/cu_common.cuh). Inside a step's graph each
# kernel -> kernel edge is programmatic (cu_graph.cu): a kernel's blocks may start while the kernel before it is
# still running, and only that first statement holds them until its writes are visible. A kernel without it
# would race its predecessor, so this reads the sources (no GPU needed): the first statement of every
# __global__ function in src/backend/cuda/*.cu must be the wait. Prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
ROOT=${DSV4_ROOT:-.}

# kernels_without_wait FILE...: "file: kernel" for each __global__ function whose body does not open with the wait
kernels_without_wait() {
    perl -0777 -ne '
        while (/__global__\s[^{;]*?(\w+)\s*\([^{;]*\)\s*\{\s*([^\n]*)/g) {
            my ($name, $first) = ($1, $2);
            print "$ARGV: $name\n" unless $first =~ /^dev_grid_wait\(\);/;
        }' "$@"
}
count_kernels() { perl -0777 -ne '$n++ while /__global__\s[^{;]*?\w+\s*\([^{;]*\)\s*\{/g; END { print $n + 0 }' "$@"; }

files=("$ROOT"/src/backend/cuda/*.cu)
n=$(count_kernels "${files[@]}")
[ "$n" -ge 40 ] && ok || bad "found only $n kernels in src/backend/cuda/*.cu: is the pattern still right?"
missing=$(kernels_without_wait "${files[@]}")
[ -z "$missing" ] && ok || bad "kernels that do not begin with dev_grid_wait(): $missing"

# the check itself catches a kernel without the wait (launch bounds and a template on the way)
cat >"$T/k.cu" <<'CU'
template <int N>
__global__ void __launch_bounds__(128) k_good(const float *x, int n) {
    dev_grid_wait();
    if (n) return;
}
__global__ void k_bad(const float *x,
                      int n) {
    const int i = threadIdx.x;
    dev_grid_wait();
}
CU
[ "$(kernels_without_wait "$T/k.cu")" = "$T/k.cu: k_bad" ] && ok || bad "the check missed k_bad: '$(kernels_without_wait "$T/k.cu")'"
[ "$(count_kernels "$T/k.cu")" = 2 ] && ok || bad "counted $(count_kernels "$T/k.cu") kernels in the sample, want 2"
finish
