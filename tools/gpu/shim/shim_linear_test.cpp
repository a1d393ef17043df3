/* tools/gpu/shim/shim_linear.sh's test: cu_linear of F32 split rows (few, long rows: the mHC mixes) for T tokens
 * takes the tile kernel (k_linear_split_tile) from SPT_MIN_T tokens on (16 in this build), and k_linear_split
 * below; every output of a batch must have the bytes of the same token computed alone, and be close to a
 * double-precision sum (so that the two kernels cannot agree on something wrong). Shapes: the Flash mix (24 x 16384), a row count and a column count
 * that leave partial row blocks and segments (20 x 2064), 64 x 4096; T = 16, 37. Exits 1 at the first difference. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
extern "C" {
#include "backend/cuda/cu_kernels.h"
}

#include "shim_rng.h"
/* values over many binades, with zeros */
static float value() {
    const uint32_t k = next_u32() % 16;
    if (k == 0) return 0.0f;
    return ldexpf(frand(1.0f), (int)(next_u32() % 20) - 10);
}

int main() {
    const int shapes[][2] = { { 24, 16384 }, { 20, 2064 }, { 64, 4096 } };
    const int Ts[] = { 16, 37 };
    for (const auto &sh : shapes) {
        const int rows = sh[0], cols = sh[1];
        std::vector<float> w((size_t)rows * cols);
        for (auto &v : w) v = value();
        for (int T : Ts) {
            std::vector<float> x((size_t)T * cols), batch((size_t)T * rows), one(rows);
            for (auto &v : x) v = value();
            dsv4_weight dw;
            memset(&dw, 0, sizeof dw);
            dw.data = w.data();
            dw.fmt = WF_F32;
            dw.rows = rows;
            dw.cols = cols;
            cu_linear(nullptr, &dw, x.data(), T, cols, batch.data(), rows);
            double worst = 0.0;
            for (int t = 0; t < T; t++) {
                cu_linear(nullptr, &dw, x.data() + (size_t)t * cols, 1, cols, one.data(), rows);
                if (memcmp(one.data(), batch.data() + (size_t)t * rows, sizeof(float) * rows)) {
                    for (int o = 0; o < rows; o++)
                        if (memcmp(&one[o], &batch[(size_t)t * rows + o], sizeof(float))) {
                            printf("FAIL %d x %d, T = %d: token %d row %d alone %.9g, in the batch %.9g\n", rows, cols, T, t, o,
                                   one[o], batch[(size_t)t * rows + o]);
                            return 1;
                        }
                }
                for (int o = 0; o < rows; o++) {
                    double s = 0.0, a = 0.0;
                    for (int c = 0; c < cols; c++) {
                        s += (double)w[(size_t)o * cols + c] * x[(size_t)t * cols + c];
                        a += fabs((double)w[(size_t)o * cols + c] * x[(size_t)t * cols + c]);
                    }
                    const double e = a > 0 ? fabs(one[o] - s) / a : fabs(one[o] - s);
                    if (e > worst) worst = e;
                }
            }
            if (!(worst < 1e-6)) {
                printf("FAIL %d x %d, T = %d: %.3g of sum |w x| from the double sum\n", rows, cols, T, worst);
                return 1;
            }
            printf("  %2d x %5d, T = %2d: the batch (tile kernel) = each token alone (split kernel) by memcmp; %.2g of sum |w x| "
                   "from the double sum\n", rows, cols, T, worst);
        }
    }
    printf("shim_linear: all equal\n");
    return 0;
}
