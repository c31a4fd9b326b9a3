/*
 * asm/aarch64/matvec_neon.S -- tiled matrix-vector product, AArch64 Advanced SIMD (fp32 weights, and
 * fp16 weights widened exactly with fcvtl/fcvtl2: base ARMv8.0, no FEAT_FP16 needed).
 *
 * The weights are tiled [n_tiles][n_in][64] (docs/kernels.md, gpt2asm_matvec_f32): one tile is the
 * 64 outputs 64t .. 64t+63, stored input-major, so a tile is one contiguous stream of n_in rows of
 * 64 weights.  The 64 sums of a tile live in v16-v31 for the whole stream; x is loaded four inputs at
 * a time (ld1 {v0.4s}) and each row is multiplied into the 16 accumulators with by-element FMAs
 * (fmla vd.4s, vw.4s, v0.s[i]).  A row is four ld1 {4 x q} loads (256 bytes; 128 for fp16), 16
 * independent FMA chains cover the FMA latency; the kernel is bound by the memory bandwidth.
 *
 * Per output o = 64t + j the operation sequence is exactly the contract's:
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc);
 *     y[o] = acc + b[o]        (y[o] = acc when b is NULL)
 * so the outputs are bit-identical to gpt2asm_matvec_*_avx2 / _avx512 and the SME2 kernels.
 *
 * Registers (both functions):
 *     x0  w: current weight row           x1  x (argument)          x2  b (+64*tile_begin) or NULL
 *     x3  y (+64*tile_begin)              x4  n_in                  x5  tile_begin, then tiles left
 *     x10 x cursor                        x11 row-block counter
 *     v16-v31  the 64 accumulators        v0  x[i .. i+3]           v4-v15  weights
 */
#include "asm.S"
#include "math_neon.h"

/* Prefetch distance in bytes ahead of the row being read (0: none, the default).  The hardware
 * prefetchers of current Arm cores follow the single forward stream of the tiles; kept as a knob
 * (-DMATVEC_PF_DIST=2048) for cores where software prefetch measures better. */
#ifndef MATVEC_PF_DIST
#  define MATVEC_PF_DIST 0
#endif

        .macro  pf_row
#if MATVEC_PF_DIST
        prfm    pldl1strm, [x0, #MATVEC_PF_DIST]
        prfm    pldl1strm, [x0, #MATVEC_PF_DIST + 64]
#endif
        .endm

        .macro  row32 lane
        pf_row
        row_f32 0, 0, \lane
        .endm

        .macro  row16 lane
        pf_row
        row_f16 0, 0, \lane
        .endm

        /* the whole kernel body: \row is row32 or row16, \rb the log2 of the row size in bytes */
        .macro  matvec_body row, rb
        subs    x5, x6, x5                              // tiles = tile_end - tile_begin ...
        b.ls    9f                                      // ... nothing to do when tile_end <= tile_begin
        sub     x6, x6, x5                              // tile_begin again
        frame_push
        add     x3, x3, x6, lsl #8                      // y += 64 * tile_begin
        cbz     x2, 1f
        add     x2, x2, x6, lsl #8                      // b += 64 * tile_begin (only if non-NULL)
1:
        mul     x7, x6, x4                              // tile_begin * n_in rows
        add     x0, x0, x7, lsl #\rb                    // w += tile_begin * n_in * row bytes
        .p2align 4
2:                                                      // for each tile
        zero_acc
        mov     x10, x1                                 // x cursor
        lsr     x11, x4, #2                             // n_in / 4 blocks of 4 rows
        cbz     x11, 4f
        .p2align 4
3:                                                      // 4 rows, in input order
        ld1     {v0.4s}, [x10], #16                     // x[i .. i+3]
        \row    0
        \row    1
        \row    2
        \row    3
        subs    x11, x11, #1
        b.ne    3b
4:
        ands    x11, x4, #3                             // n_in % 4 rows left
        b.eq    6f
5:
        ld1r    {v0.4s}, [x10], #4                      // x[i]
        \row    0
        subs    x11, x11, #1
        b.ne    5b
6:                                                      // x0 now points at the next tile
        cbz     x2, 7f
        ld1     {v4.4s - v7.4s}, [x2], #64              // y = acc + b
        ld1     {v8.4s - v11.4s}, [x2], #64
        fadd    v16.4s, v16.4s, v4.4s
        fadd    v17.4s, v17.4s, v5.4s
        fadd    v18.4s, v18.4s, v6.4s
        fadd    v19.4s, v19.4s, v7.4s
        ld1     {v4.4s - v7.4s}, [x2], #64
        fadd    v20.4s, v20.4s, v8.4s
        fadd    v21.4s, v21.4s, v9.4s
        fadd    v22.4s, v22.4s, v10.4s
        fadd    v23.4s, v23.4s, v11.4s
        ld1     {v8.4s - v11.4s}, [x2], #64
        fadd    v24.4s, v24.4s, v4.4s
        fadd    v25.4s, v25.4s, v5.4s
        fadd    v26.4s, v26.4s, v6.4s
        fadd    v27.4s, v27.4s, v7.4s
        fadd    v28.4s, v28.4s, v8.4s
        fadd    v29.4s, v29.4s, v9.4s
        fadd    v30.4s, v30.4s, v10.4s
        fadd    v31.4s, v31.4s, v11.4s
7:
        store_acc 3
        subs    x5, x5, #1
        b.ne    2b
        frame_pop
9:
        ret
        .endm

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_matvec_f32_neon(const float *w, const float *x, const float *b, float *y,
 *                              size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   for t in tile_begin .. tile_end-1, j in 0..63, o = 64t + j:
 *       acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc)
 *       y[o] = b ? acc + b[o] : acc
 *   w: [n_tiles][n_in][64] floats, 64-byte aligned.  x, b, y: any alignment.
 */
function gpt2asm_matvec_f32_neon, export=1
        matvec_body row32, 8
endfunc

/*
 * void gpt2asm_matvec_f16_neon(const uint16_t *w, const float *x, const float *b, float *y,
 *                              size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   as gpt2asm_matvec_f32_neon with w[t][i][j] binary16, widened exactly (fcvtl/fcvtl2) before the
 *   FMA:  acc = fma((float)w[t][i][j], x[i], acc)
 *   w: [n_tiles][n_in][64] halves (128 bytes per row), 64-byte aligned.
 */
function gpt2asm_matvec_f16_neon, export=1
        matvec_body row16, 7
endfunc
