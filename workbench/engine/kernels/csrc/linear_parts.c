#include "wb.h"

/* A projection whose rows are parts in different layouts: the fused Q/K/V of a GGUF file that
 * quantized V to another block type than Q and K (llama.cpp's mixes: Q4_K_M keeps some V and
 * down projections in Q6_K), gate/up likewise. Each part goes through its own product
 * function (`wb_linear_fn`) into its columns of y, the same bits as the part alone: the
 * functions' rows never depend on each other.
 *
 * w: the parts' table, int64 [1 + 3 count]: count, then per part its function, its weight and
 * its rows (the parts' rows add up to N, in order). b: the bias [N] or NULL. float32 rows. */
void wb_linear_parts(const void *x, const void *w, const void *b, void *y, int64_t M,
                     int64_t N, int64_t K, int threads) {
    const int64_t *table = (const int64_t *)w, count = table[0];
    float *out = (float *)y, *part_out = NULL;
    if (M > 1) {  /* a part's [M, rows] apart, then copied to its columns */
        int64_t widest = 0;
        for (int64_t i = 0; i < count; ++i)
            widest = table[3 + 3 * i] > widest ? table[3 + 3 * i] : widest;
        /* this thread's scratch, kept between calls (the parts' GGUF functions use none) */
        part_out = wb_scratch(M * widest * (int64_t)sizeof(float));
        if (!part_out) {
            for (int64_t i = 0; i < M * N; ++i) out[i] = NAN;
            return;
        }
    }
    for (int64_t i = 0, at = 0; i < count; at += table[3 + 3 * i], ++i) {
        const wb_linear_fn fn = (wb_linear_fn)(intptr_t)table[1 + 3 * i];
        const int64_t rows = table[3 + 3 * i];
        const float *bias = b ? (const float *)b + at : NULL;
        fn(x, (const void *)(intptr_t)table[2 + 3 * i], bias, M > 1 ? part_out : out + at, M,
           rows, K, threads);
        if (M > 1)
            for (int64_t m = 0; m < M; ++m)
                memcpy(out + m * N + at, part_out + m * rows, (size_t)rows * sizeof(float));
    }
}
