#!/usr/bin/env bash
# Every CUDA kernel begins with dev_grid_wait() (src/backend/cuda/cu_common.cuh). Inside a step's graph each
# kernel -> kernel edge is programmatic (cu_graph.cu): a kernel's blocks may start while the kernel before it is
# still running, and only that first statement holds them until its writes are visible. A kernel without it
# would race its predecessor, so this reads the sources (no GPU needed): the first statement of every
# __global__ function in src/backend/cuda/*.cu must be the wait. Prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
ROOT=${DSV4_ROOT:-.}

# kernels_without_wait FILE...: "file: kernel" for each __global__ function whose body does not open with the wait
# (dev_grid_wait, or dev_grid_wait_deferred<...> in the kernels of DEFERRING, which wait after their weight loads)
DEFERRING="k_mma_linear k_mma16_linear"
kernels_without_wait() {
    DEFERRING="$DEFERRING" perl -0777 -ne '
        my %defer = map { $_ => 1 } split " ", $ENV{DEFERRING};
        s/__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)//g;   # so that the name is the identifier before the parameters
        while (/__global__\s[^{;]*?(\w+)\s*\([^{;]*\)\s*\{\s*([^\n]*)/g) {
            my ($name, $first) = ($1, $2);
            next if $first =~ /^dev_grid_wait\(\);/ || ($defer{$name} && $first =~ /^dev_grid_wait_deferred<[^;]*>\(\);/);
            print "$ARGV: $name\n";
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
__global__ void __launch_bounds__(32 * (4), 2) k_mma_linear(const float *x) {
    dev_grid_wait_deferred<true>();
}
__global__ void k_other(const float *x) {
    dev_grid_wait_deferred<true>();
}
CU
[ "$(kernels_without_wait "$T/k.cu" | tr '\n' ' ')" = "$T/k.cu: k_bad $T/k.cu: k_other " ] && ok ||
    bad "the check missed k_bad or a deferral outside DEFERRING: '$(kernels_without_wait "$T/k.cu")'"
[ "$(count_kernels "$T/k.cu")" = 4 ] && ok || bad "counted $(count_kernels "$T/k.cu") kernels in the sample, want 4"
# the deferring kernels still wait: dev_grid_wait in the block functions they call
for f in k_mma.cu:mma_block k_mma16.cu:mma16_block; do
    perl -0777 -ne 'exit !(/void \Q'"${f#*:}"'\E\(.*?if constexpr \(PRE\) \{\s*load_w\(part\);\s*dev_grid_wait\(\);/s)' "$ROOT/src/backend/cuda/${f%%:*}" &&
        ok || bad "${f#*:} no longer waits after its first weight loads (PRE)"
done
finish
