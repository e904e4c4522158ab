#include "wb.h"

/* bfloat16 products on CPUs with AMX (the "amx" kernel): TDPBF16PS multiplies a tile of up to 16
 * input rows x 32 of K by a tile of 32 of K x 16 weight rows, accumulating float32 in a tile of
 * 16 x 16. The weights are repacked once (`wb_amx_pack`) into the tiles' layout, zero padded
 * to whole tiles: wp[N/16][K/32][16 pairs of k][16 rows][2]; each block of 2 x 16 weight rows
 * streams through once per call while every 16 input rows (copied into zero padded tiles)
 * multiply with it. float32 sums, one rounding to bf16 (nearest even) with the bias: the same
 * semantics as `wb_linear_bf16` (a sum's order inside a tile is the hardware's). The OS must
 * grant the process AMX's tile state first (`wb_amx_enable`). On an AMX Xeon, a decode step's
 * products for SmolLM2: 11.3 ms at one row (12.2 with AVX-512 BF16, 15.1 with oneDNN), 12.0
 * at sixteen (37.2, 15.8). GCC 11 / clang 12 and later; older compilers leave it out. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)

int wb_amx_enable(void) {  /* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): 0 if granted */
    return (int)syscall(SYS_arch_prctl, 0x1023, 18);
}

static inline int64_t wb_round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* w [N, K] -> wp (wb_round_up(N, 16) * wb_round_up(K, 32) elements), the tiles' layout */
void wb_amx_pack(const uint16_t *w, uint16_t *wp, int64_t N, int64_t K) {
    const int64_t KC = wb_round_up(K, 32) / 32, NP = wb_round_up(N, 16);
    for (int64_t n = 0; n < NP; ++n)
        for (int64_t k = 0; k < KC * 32; ++k)
            wp[((n / 16 * KC + k / 32) * 16 + k % 32 / 2) * 32 + n % 16 * 2 + (k & 1)] =
                n < N && k < K ? w[n * K + k] : 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} wb_tile_config;

__attribute__((target("amx-tile,amx-bf16")))
void wb_linear_bf16_amx(const uint16_t *x, const uint16_t *wp, const uint16_t *b, uint16_t *y,
                        int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t KC = wb_round_up(K, 32) / 32, MP = wb_round_up(M, 16);
    const int64_t NB = wb_round_up(N, 16) / 16, ld = KC * 32;
    uint16_t *xt = wb_scratch(MP * ld * 2);  /* x in whole tiles */
    if (!xt) return;
    for (int64_t m = 0; m < MP; ++m) {
        if (m < M) memcpy(xt + m * ld, x + m * K, (size_t)(K * 2));
        memset(xt + m * ld + (m < M ? K : 0), 0, (size_t)((ld - (m < M ? K : 0)) * 2));
    }
    const uint16_t *xp = xt;
#pragma omp parallel num_threads(threads)
    {
        wb_tile_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 5; ++t) {  /* A, B0, B1, C0, C1: 16 rows of 64 bytes each */
            cfg.rows[t] = 16;
            cfg.colsb[t] = 64;
        }
        _tile_loadconfig(&cfg);
        float c[2][16][16];
#pragma omp for schedule(static)
        for (int64_t nb = 0; nb < NB; nb += 2) {  /* two blocks of 16 weight rows at a time */
            const int two = nb + 1 < NB;
            const uint16_t *w0 = wp + nb * KC * 512, *w1 = w0 + KC * 512;
            for (int64_t m0 = 0; m0 < MP; m0 += 16) {
                _tile_zero(3);
                _tile_zero(4);
                for (int64_t kc = 0; kc < KC; ++kc) {
                    _tile_loadd(0, xp + m0 * ld + kc * 32, ld * 2);
                    _tile_loadd(1, w0 + kc * 512, 64);
                    _tile_dpbf16ps(3, 0, 1);
                    if (two) {
                        _tile_loadd(2, w1 + kc * 512, 64);
                        _tile_dpbf16ps(4, 0, 2);
                    }
                }
                _tile_stored(3, c[0], 64);
                if (two) _tile_stored(4, c[1], 64);
                for (int t = 0; t <= two; ++t)
                    for (int64_t i = 0; i < 16 && m0 + i < M; ++i)
                        for (int64_t j = 0; j < 16 && (nb + t) * 16 + j < N; ++j) {
                            const int64_t n = (nb + t) * 16 + j;
                            y[(m0 + i) * N + n] =
                                wb_round_bf16(c[t][i][j] + (b ? wb_bf16_to_f32(b[n]) : 0.0f));
                        }
            }
        }
        _tile_release();
    }
}
#endif
