/*
 * asm/aarch64/matvec_q8_neon.S -- tiled matrix-vector product with int8 weights, AArch64 Advanced SIMD
 * (base ARMv8.0: no FEAT_FP16, no dot-product extensions).
 *
 * Weight-only symmetric quantisation (docs/kernels.md, gpt2asm_matvec_q8): the weights are int8, tiled
 * [n_tiles][n_in][64] like the fp32 ones (one 64-byte row = one cache line per input of a tile), with
 * one fp32 scale per output.  As in matvec_neon.S the 64 sums of a tile live in v16-v31 for the whole
 * stream and x is loaded four inputs at a time for by-element FMAs (fmla vd.4s, vw.4s, v0.s[i]).  A row
 * is one ld1 {4 x 16b} (64 bytes), widened exactly in registers: sxtl/sxtl2 to 16 bits, sxtl/sxtl2 to
 * 32 bits, scvtf (exact: |w| <= 128 < 2^24), then the same input-order FMAs as the fp32 kernel.  Per 64
 * weights: 1 load, 8 + 16 extends, 16 converts, 16 FMAs.
 *
 * Per output o = 64t + j the operation sequence is exactly the contract's:
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], x[i], acc);
 *     p = acc * scale[o];   y[o] = p + b[o]        (y[o] = p when b is NULL)
 * two roundings in the epilogue (fmul, then fadd; never a fused fma), so the outputs are bit-identical
 * to gpt2asm_matvec_q8_avx2 / _avx512 (and the prefill kernels gpt2asm_matmul_q8_*).  Operand roles as
 * on x86 (acc first in the multiply, p first in the add), so even NaN payloads agree where AArch64's
 * and x86's propagation rules coincide (they are not part of the contract).
 *
 * Registers:
 *     x0  w: current weight row         x1  scale (+64*tile_begin)        x2  x (argument)
 *     x3  b (+64*tile_begin) or NULL    x4  y (+64*tile_begin)            x5  n_in
 *     x6  tile_begin                    x7  tiles left                    x9  scratch
 *     x10 x cursor                      x11 row-block counter
 *     v16-v31  the 64 accumulators      v0  x[i .. i+3]                   v4-v7  the row's 64 bytes
 *     v8, v9, v14, v15  int16 halves    v1-v5, v10-v13  int32 -> float    (d8-d15 saved: frame_push)
 */
#include "asm.S"
#include "math_neon.h"

/* Prefetch distance in bytes ahead of the row being read (0: none, the default).  As for the fp32
 * kernel the hardware prefetchers follow the single forward stream of the tiles; kept as a knob
 * (-DQ8_PF_DIST=2048) for cores where software prefetch measures better. */
#ifndef Q8_PF_DIST
#  define Q8_PF_DIST 0
#endif

        /* one int8 row (64 bytes at [x0], advanced by 64):
         * acc[k] = fma((float)w[4k .. 4k+3], x[i], acc[k]) with x[i] = v0.s[\lane], k = 0 .. 15 */
        .macro  row_q8 lane
#if Q8_PF_DIST
        prfm    pldl1strm, [x0, #Q8_PF_DIST]
#endif
        ld1     {v4.16b - v7.16b}, [x0], #64            // w[t][i][0 .. 63]
        sxtl    v8.8h, v4.8b                            // 0-7     int16
        sxtl2   v9.8h, v4.16b                           // 8-15
        sxtl    v10.4s, v8.4h                           // 0-3     int32
        sxtl2   v11.4s, v8.8h                           // 4-7
        sxtl    v12.4s, v9.4h                           // 8-11
        sxtl2   v13.4s, v9.8h                           // 12-15
        sxtl    v14.8h, v5.8b                           // 16-23
        sxtl2   v15.8h, v5.16b                          // 24-31
        scvtf   v10.4s, v10.4s                          // exact
        scvtf   v11.4s, v11.4s
        scvtf   v12.4s, v12.4s
        scvtf   v13.4s, v13.4s
        sxtl    v1.4s, v14.4h                           // 16-19
        sxtl2   v2.4s, v14.8h                           // 20-23
        sxtl    v3.4s, v15.4h                           // 24-27
        sxtl2   v4.4s, v15.8h                           // 28-31   (bytes 0-15 consumed)
        fmla    v16.4s, v10.4s, v0.s[\lane]
        fmla    v17.4s, v11.4s, v0.s[\lane]
        fmla    v18.4s, v12.4s, v0.s[\lane]
        fmla    v19.4s, v13.4s, v0.s[\lane]
        scvtf   v1.4s, v1.4s
        scvtf   v2.4s, v2.4s
        scvtf   v3.4s, v3.4s
        scvtf   v4.4s, v4.4s
        sxtl    v8.8h, v6.8b                            // 32-39
        sxtl2   v9.8h, v6.16b                           // 40-47
        fmla    v20.4s, v1.4s, v0.s[\lane]
        fmla    v21.4s, v2.4s, v0.s[\lane]
        fmla    v22.4s, v3.4s, v0.s[\lane]
        fmla    v23.4s, v4.4s, v0.s[\lane]
        sxtl    v10.4s, v8.4h                           // 32-35
        sxtl2   v11.4s, v8.8h                           // 36-39
        sxtl    v12.4s, v9.4h                           // 40-43
        sxtl2   v13.4s, v9.8h                           // 44-47
        sxtl    v14.8h, v7.8b                           // 48-55
        sxtl2   v15.8h, v7.16b                          // 56-63
        scvtf   v10.4s, v10.4s
        scvtf   v11.4s, v11.4s
        scvtf   v12.4s, v12.4s
        scvtf   v13.4s, v13.4s
        sxtl    v1.4s, v14.4h                           // 48-51
        sxtl2   v2.4s, v14.8h                           // 52-55
        sxtl    v3.4s, v15.4h                           // 56-59
        sxtl2   v5.4s, v15.8h                           // 60-63   (bytes 16-31 consumed)
        fmla    v24.4s, v10.4s, v0.s[\lane]
        fmla    v25.4s, v11.4s, v0.s[\lane]
        fmla    v26.4s, v12.4s, v0.s[\lane]
        fmla    v27.4s, v13.4s, v0.s[\lane]
        scvtf   v1.4s, v1.4s
        scvtf   v2.4s, v2.4s
        scvtf   v3.4s, v3.4s
        scvtf   v5.4s, v5.4s
        fmla    v28.4s, v1.4s, v0.s[\lane]
        fmla    v29.4s, v2.4s, v0.s[\lane]
        fmla    v30.4s, v3.4s, v0.s[\lane]
        fmla    v31.4s, v5.4s, v0.s[\lane]
        .endm

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_matvec_q8_neon(const int8_t *w, const float *scale, const float *x, const float *b,
 *                             float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   for t in tile_begin .. tile_end-1, j in 0..63, o = 64t + j:
 *       acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], x[i], acc)
 *       p = acc * scale[o];  y[o] = b ? p + b[o] : p
 *   w: [n_tiles][n_in][64] int8, 64-byte aligned.  scale, x, b, y: any alignment.
 *   Only tiles tile_begin .. tile_end-1 of w (and their scale, b) are read, only their y written.
 */
function gpt2asm_matvec_q8_neon, export=1
        subs    x7, x7, x6                              // tiles = tile_end - tile_begin ...
        b.ls    9f                                      // ... nothing to do when tile_end <= tile_begin
        frame_push
        lsl     x9, x6, #8                              // 64 floats = 256 bytes of scale / b / y per tile
        add     x1, x1, x9                              // scale += 64 * tile_begin
        add     x4, x4, x9                              // y += 64 * tile_begin
        cbz     x3, 1f
        add     x3, x3, x9                              // b += 64 * tile_begin (only if non-NULL)
1:
        mul     x9, x6, x5                              // tile_begin * n_in rows
        add     x0, x0, x9, lsl #6                      // w += tile_begin * n_in * 64 bytes
        .p2align 4
2:                                                      // for each tile
        zero_acc                                        // acc = +0.0
        mov     x10, x2                                 // x cursor
        lsr     x11, x5, #2                             // n_in / 4 blocks of 4 rows
        cbz     x11, 4f
        .p2align 4
3:                                                      // 4 rows, in input order
        ld1     {v0.4s}, [x10], #16                     // x[i .. i+3]
        row_q8  0
        row_q8  1
        row_q8  2
        row_q8  3
        subs    x11, x11, #1
        b.ne    3b
4:
        ands    x11, x5, #3                             // n_in % 4 rows left
        b.eq    6f
5:
        ld1r    {v0.4s}, [x10], #4                      // x[i]
        row_q8  0
        subs    x11, x11, #1
        b.ne    5b
6:                                                      // x0 now points at the next tile
        ld1     {v4.4s - v7.4s}, [x1], #64              // p = acc * scale
        ld1     {v8.4s - v11.4s}, [x1], #64
        fmul    v16.4s, v16.4s, v4.4s
        fmul    v17.4s, v17.4s, v5.4s
        fmul    v18.4s, v18.4s, v6.4s
        fmul    v19.4s, v19.4s, v7.4s
        ld1     {v4.4s - v7.4s}, [x1], #64
        fmul    v20.4s, v20.4s, v8.4s
        fmul    v21.4s, v21.4s, v9.4s
        fmul    v22.4s, v22.4s, v10.4s
        fmul    v23.4s, v23.4s, v11.4s
        ld1     {v8.4s - v11.4s}, [x1], #64
        fmul    v24.4s, v24.4s, v4.4s
        fmul    v25.4s, v25.4s, v5.4s
        fmul    v26.4s, v26.4s, v6.4s
        fmul    v27.4s, v27.4s, v7.4s
        fmul    v28.4s, v28.4s, v8.4s
        fmul    v29.4s, v29.4s, v9.4s
        fmul    v30.4s, v30.4s, v10.4s
        fmul    v31.4s, v31.4s, v11.4s
        cbz     x3, 7f
        ld1     {v4.4s - v7.4s}, [x3], #64              // y = p + b
        ld1     {v8.4s - v11.4s}, [x3], #64
        fadd    v16.4s, v16.4s, v4.4s
        fadd    v17.4s, v17.4s, v5.4s
        fadd    v18.4s, v18.4s, v6.4s
        fadd    v19.4s, v19.4s, v7.4s
        ld1     {v4.4s - v7.4s}, [x3], #64
        fadd    v20.4s, v20.4s, v8.4s
        fadd    v21.4s, v21.4s, v9.4s
        fadd    v22.4s, v22.4s, v10.4s
        fadd    v23.4s, v23.4s, v11.4s
        ld1     {v8.4s - v11.4s}, [x3], #64
        fadd    v24.4s, v24.4s, v4.4s
        fadd    v25.4s, v25.4s, v5.4s
        fadd    v26.4s, v26.4s, v6.4s
        fadd    v27.4s, v27.4s, v7.4s
        fadd    v28.4s, v28.4s, v8.4s
        fadd    v29.4s, v29.4s, v9.4s
        fadd    v30.4s, v30.4s, v10.4s
        fadd    v31.4s, v31.4s, v11.4s
7:
        store_acc 4                                     // y[64t .. 64t+63], x4 advanced by 256
        subs    x7, x7, #1
        b.ne    2b
        frame_pop
9:
        ret
endfunc
