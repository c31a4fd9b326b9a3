/*
 * asm/aarch64/matmul_neon.S -- batched (prefill) matrix-matrix products on the tiled weights, AArch64
 * Advanced SIMD (base ARMv8.0: fp16 weights widened by fcvtl/fcvtl2).
 *
 *     Y[t][o] = sum_i W[o][i] * X[t][i] (+ b[o]),   for T tokens t and the outputs o of a tile range
 *
 * with the weights in exactly the layout of the matvec kernels ([n_tiles][n_in][64], fp32 or fp16),
 * and EACH (token, output) pair computed with the operation sequence of the NEON matvec kernel of that
 * dtype (docs/kernels.md, gpt2asm_matmul):
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], X[tok][i], acc)
 *     y = acc + b[o]                                (y = acc when b is NULL)
 * with the same instructions and operand roles (fmla vacc, vw, vx.s[lane]: the fused acc + w * x;
 * fadd acc, b), so every row of Y has the bits of gpt2asm_matvec_<dtype>_neon on that
 * row of X (NaN payloads included), and of the x86 kernels.
 *
 * Blocking.  For each tile (64 outputs) in [tile_begin, tile_end), for each block of 8 tokens, for each
 * of the tile's 8 strips of 8 outputs: 16 accumulators (8 tokens x 2 q registers) live in v16-v31 while
 * the strip's rows stream by; each row's 8 weights are loaded (and widened) once into 2 registers and
 * multiplied into all 8 tokens' sums by 16 by-element FMAs, X[tok][i .. i+3] being one ld1 per token
 * (v0-v7) per 4 rows (a remaining 1-3 rows: ld1r).  A last block of 5-7 tokens runs the same code with
 * fewer accumulators; one of 1-4 tokens uses strips of 16 outputs (4 registers per token, 4-16
 * accumulators), so short blocks keep more independent FMA chains.  Rows are read in input order, in
 * groups of 4 alternating between two weight register sets (v8-v11, v12-v15).  No K-blocking: a tile is
 * streamed once per block of tokens (from L2 after the first).  Not measured on hardware.
 *
 * Registers (after the argument shuffle -- x1 .. x7 moved up one register -- the same for both dtypes):
 *     x0  w: the current tile              x1  unused                        x2  X
 *     x3  ldx in bytes                     x4  b (+64*tile) or NULL          x5  y (+64*tile)
 *     x6  ldy in bytes                     x7  n_tokens                      x8  n_in
 *     x9  tiles left                       x10-x17  X cursors of tokens 0-7 (epilogue: x10 y cursor,
 *     x19 weight cursor                    x20 row counter                   x11 b of the strip)
 *     x21 strip offset in bytes of y, b (0 .. 224)                           x22 tokens left
 *     x23 X of the current token block     x24 y of the current token block  x25 row stride in bytes
 *     v0-v7  X[tok][i .. i+3]   v8-v15  weights (epilogue: bias v12-v15)   v16-v31  sums
 * x19-x25 and d8-d15 are saved (AAPCS64); x18 is never touched.
 */
#include "asm.S"

#define DT_F32 0
#define DT_F16 1

        /* one row of the strip (8 or 16 weights at [x19], x19 += row stride) into v\wa, v\wb
         * (\nv = 2) or v\wa .. v\wd (\nv = 4), widened exactly to binary32, outputs in order */
        .macro  mm_wload dt, nv, wa, wb, wc, wd
        .if \dt == DT_F32
        .if \nv == 2
        ld1     {v\wa\().4s, v\wb\().4s}, [x19], x25
        .else
        ld1     {v\wa\().4s, v\wb\().4s, v\wc\().4s, v\wd\().4s}, [x19], x25
        .endif
        .elseif \dt == DT_F16
        .if \nv == 2
        ld1     {v\wa\().8h}, [x19], x25
        fcvtl2  v\wb\().4s, v\wa\().8h                  // 4-7
        fcvtl   v\wa\().4s, v\wa\().4h                  // 0-3
        .else
        ld1     {v\wa\().8h, v\wb\().8h}, [x19], x25
        fcvtl2  v\wd\().4s, v\wb\().8h                  // 12-15
        fcvtl   v\wc\().4s, v\wb\().4h                  // 8-11
        fcvtl2  v\wb\().4s, v\wa\().8h                  // 4-7
        fcvtl   v\wa\().4s, v\wa\().4h                  // 0-3
        .endif
        .endif
        .endm

        /* acc = fma(w, X[tok][i], acc), the matvec's fmla with its operand roles */
        .macro  fm2 a0, a1, x, lane, wa, wb
        fmla    v\a0\().4s, v\wa\().4s, v\x\().s[\lane]
        fmla    v\a1\().4s, v\wb\().4s, v\x\().s[\lane]
        .endm

        /* one row multiplied into the \mt tokens' sums; x[i] of token t in lane \lane of v<t> */
        .macro  mm_fma mt, nv, lane, wa, wb, wc, wd
        .if \nv == 2
        fm2     16, 17, 0, \lane, \wa, \wb
        .if \mt >= 2
        fm2     18, 19, 1, \lane, \wa, \wb
        .endif
        .if \mt >= 3
        fm2     20, 21, 2, \lane, \wa, \wb
        .endif
        .if \mt >= 4
        fm2     22, 23, 3, \lane, \wa, \wb
        .endif
        .if \mt >= 5
        fm2     24, 25, 4, \lane, \wa, \wb
        .endif
        .if \mt >= 6
        fm2     26, 27, 5, \lane, \wa, \wb
        .endif
        .if \mt >= 7
        fm2     28, 29, 6, \lane, \wa, \wb
        .endif
        .if \mt >= 8
        fm2     30, 31, 7, \lane, \wa, \wb
        .endif
        .else
        fm2     16, 17, 0, \lane, \wa, \wb
        fm2     18, 19, 0, \lane, \wc, \wd
        .if \mt >= 2
        fm2     20, 21, 1, \lane, \wa, \wb
        fm2     22, 23, 1, \lane, \wc, \wd
        .endif
        .if \mt >= 3
        fm2     24, 25, 2, \lane, \wa, \wb
        fm2     26, 27, 2, \lane, \wc, \wd
        .endif
        .if \mt >= 4
        fm2     28, 29, 3, \lane, \wa, \wb
        fm2     30, 31, 3, \lane, \wc, \wd
        .endif
        .endif
        .endm

        /* X of token \t (cursor x\p) into v\t: 4 inputs (\four = 1) or 1 input in every lane */
        .macro  xl1 t, p, mt, four
        .if \t < \mt
        .if \four
        ld1     {v\t\().4s}, [x\p], #16
        .else
        ld1r    {v\t\().4s}, [x\p], #4
        .endif
        .endif
        .endm

        .macro  mm_xload mt, four
        xl1     0, 10, \mt, \four
        xl1     1, 11, \mt, \four
        xl1     2, 12, \mt, \four
        xl1     3, 13, \mt, \four
        xl1     4, 14, \mt, \four
        xl1     5, 15, \mt, \four
        xl1     6, 16, \mt, \four
        xl1     7, 17, \mt, \four
        .endm

        /* cursor x\p = x\q + ldx for token \t < \mt */
        .macro  xc1 t, p, q, mt
        .if \t < \mt
        add     x\p, x\q, x3
        .endif
        .endm

        /* epilogue of one token: y = acc + b; y[tok][strip] = y; x10 += ldy */
        .macro  mm_out1 dt, nv, bias, a0, a1, a2, a3
        .if \bias
        fadd    v\a0\().4s, v\a0\().4s, v12.4s
        fadd    v\a1\().4s, v\a1\().4s, v13.4s
        .if \nv == 4
        fadd    v\a2\().4s, v\a2\().4s, v14.4s
        fadd    v\a3\().4s, v\a3\().4s, v15.4s
        .endif
        .endif
        .if \nv == 2
        st1     {v\a0\().4s, v\a1\().4s}, [x10], x6
        .else
        st1     {v\a0\().4s, v\a1\().4s, v\a2\().4s, v\a3\().4s}, [x10], x6
        .endif
        .endm

        .macro  mm_outs dt, mt, nv, bias
        .if \nv == 2
        mm_out1 \dt, 2, \bias, 16, 17, 0, 0
        .if \mt >= 2
        mm_out1 \dt, 2, \bias, 18, 19, 0, 0
        .endif
        .if \mt >= 3
        mm_out1 \dt, 2, \bias, 20, 21, 0, 0
        .endif
        .if \mt >= 4
        mm_out1 \dt, 2, \bias, 22, 23, 0, 0
        .endif
        .if \mt >= 5
        mm_out1 \dt, 2, \bias, 24, 25, 0, 0
        .endif
        .if \mt >= 6
        mm_out1 \dt, 2, \bias, 26, 27, 0, 0
        .endif
        .if \mt >= 7
        mm_out1 \dt, 2, \bias, 28, 29, 0, 0
        .endif
        .if \mt >= 8
        mm_out1 \dt, 2, \bias, 30, 31, 0, 0
        .endif
        .else
        mm_out1 \dt, 4, \bias, 16, 17, 18, 19
        .if \mt >= 2
        mm_out1 \dt, 4, \bias, 20, 21, 22, 23
        .endif
        .if \mt >= 3
        mm_out1 \dt, 4, \bias, 24, 25, 26, 27
        .endif
        .if \mt >= 4
        mm_out1 \dt, 4, \bias, 28, 29, 30, 31
        .endif
        .endif
        .endm

        /* v\a = +0.0 if \a < \lim */
        .macro  zacc a, lim
        .if \a < \lim
        movi    v\a\().16b, #0
        .endif
        .endm

        /* one strip (4*\nv outputs at byte offset x21 of the tile's y / b) for \mt tokens.
         * Local labels 20-26. */
        .macro  mm_strip dt, mt, nv
        .irp    a, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31
        zacc    \a, 16 + \mt * \nv                     // acc = +0.0 for the block's sums
        .endr
        .if \dt == DT_F32
        add     x19, x0, x21                            // row 0 of the strip: 16 bytes per 4 outputs
        .elseif \dt == DT_F16
        add     x19, x0, x21, lsr #1                    // 8 bytes per 4 outputs
        .endif
        mov     x10, x23                                // X cursors, tokens 0 .. mt-1
        xc1     1, 11, 10, \mt
        xc1     2, 12, 11, \mt
        xc1     3, 13, 12, \mt
        xc1     4, 14, 13, \mt
        xc1     5, 15, 14, \mt
        xc1     6, 16, 15, \mt
        xc1     7, 17, 16, \mt
        lsr     x20, x8, #2                             // n_in / 4 blocks of 4 rows
        cbz     x20, 22f
        .p2align 4
21:                                                     // 4 rows, in input order
        mm_xload \mt, 1
        mm_wload \dt, \nv, 8, 9, 10, 11
        mm_wload \dt, \nv, 12, 13, 14, 15
        mm_fma  \mt, \nv, 0, 8, 9, 10, 11
        mm_wload \dt, \nv, 8, 9, 10, 11
        mm_fma  \mt, \nv, 1, 12, 13, 14, 15
        mm_wload \dt, \nv, 12, 13, 14, 15
        mm_fma  \mt, \nv, 2, 8, 9, 10, 11
        mm_fma  \mt, \nv, 3, 12, 13, 14, 15
        subs    x20, x20, #1
        b.ne    21b
22:
        ands    x20, x8, #3                             // n_in % 4 rows left
        b.eq    24f
23:
        mm_xload \mt, 0
        mm_wload \dt, \nv, 8, 9, 10, 11
        mm_fma  \mt, \nv, 0, 8, 9, 10, 11
        subs    x20, x20, #1
        b.ne    23b
24:
        add     x10, x24, x21                           // &y[token 0 of the block][strip]
        cbz     x4, 25f
        add     x11, x4, x21
        .if \nv == 2
        ld1     {v12.4s, v13.4s}, [x11]                 // bias of the strip's outputs
        .else
        ld1     {v12.4s - v15.4s}, [x11]
        .endif
        mm_outs \dt, \mt, \nv, 1
        b       26f
25:
        mm_outs \dt, \mt, \nv, 0
26:
        .endm

        /* every strip of the current tile for a block of \mt tokens.  Local label 30. */
        .macro  mm_block dt, mt, nv
        mov     x21, #0
        .p2align 4
30:
        mm_strip \dt, \mt, \nv
        add     x21, x21, #(16 * \nv)
        cmp     x21, #256
        b.lo    30b
        .endm

        /* the whole kernel after the argument shuffle (registers above); \rb = log2(row bytes) */
        .macro  matmul_body dt, rb
        subs    x10, x10, x9                            // tiles = tile_end - tile_begin ...
        b.ls    9f                                      // ... nothing to do if tile_end <= tile_begin
        cbz     x7, 9f                                  // ... or n_tokens = 0
        stp     x19, x20, [sp, #-128]!
        stp     x21, x22, [sp, #16]
        stp     x23, x24, [sp, #32]
        str     x25, [sp, #48]
        callee_d8_d15 stp, 64
        lsl     x3, x3, #2                              // ldx in bytes
        lsl     x6, x6, #2                              // ldy in bytes
        lsl     x11, x9, #8                             // 64 floats = 256 bytes of y / b per tile
        add     x5, x5, x11                             // y += 64 * tile_begin
        cbz     x4, 1f
        add     x4, x4, x11                             // b += 64 * tile_begin (only if non-NULL)
1:
        mul     x11, x9, x8                             // tile_begin * n_in rows
        add     x0, x0, x11, lsl #\rb                   // w += tile_begin * n_in * row bytes
        mov     x9, x10                                 // tiles left
        mov     x25, #(1 << \rb)                        // row stride
        .p2align 4
2:                                                      // for each tile
        mov     x23, x2                                 // X of token 0
        mov     x24, x5                                 // y of token 0, this tile
        mov     x22, x7                                 // tokens left
        cmp     x22, #8
        b.lo    4f
3:                                                      // blocks of 8 tokens
        mm_block \dt, 8, 2
        add     x23, x23, x3, lsl #3                    // X += 8 rows
        add     x24, x24, x6, lsl #3                    // y += 8 rows
        sub     x22, x22, #8
        cmp     x22, #8
        b.hs    3b
4:                                                      // 0 .. 7 tokens left
        cmp     x22, #4
        b.hi    45f
        b.eq    44f
        cmp     x22, #2
        b.hi    43f
        b.eq    42f
        cbz     x22, 8f
        mm_block \dt, 1, 4
        b       8f
42:
        mm_block \dt, 2, 4
        b       8f
43:
        mm_block \dt, 3, 4
        b       8f
44:
        mm_block \dt, 4, 4
        b       8f
45:
        cmp     x22, #6
        b.lo    47f
        b.eq    46f
        mm_block \dt, 7, 2
        b       8f
46:
        mm_block \dt, 6, 2
        b       8f
47:
        mm_block \dt, 5, 2
8:                                                      // next tile
        add     x0, x0, x8, lsl #\rb
        add     x5, x5, #256
        cbz     x4, 5f
        add     x4, x4, #256
5:
        subs    x9, x9, #1
        b.ne    2b
        callee_d8_d15 ldp, 64
        ldr     x25, [sp, #48]
        ldp     x23, x24, [sp, #32]
        ldp     x21, x22, [sp, #16]
        ldp     x19, x20, [sp], #128
9:
        ret
        .endm

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_matmul_f32_neon(const float *w, const float *x, size_t ldx, const float *b, float *y,
 *                              size_t ldy, size_t n_tokens, size_t n_in,
 *                              size_t tile_begin, size_t tile_end);
 *   y[t*ldy + o] = acc + b[o] (acc as gpt2asm_matvec_f32_neon with x = x + t*ldx), t < n_tokens,
 *   64*tile_begin <= o < 64*tile_end.   w: [n_tiles][n_in][64] fp32.
 *   (x0 w, x1 x, x2 ldx, x3 b, x4 y, x5 ldy, x6 n_tokens, x7 n_in, [sp] tile_begin, [sp+8] tile_end)
 */
function gpt2asm_matmul_f32_neon, export=1
        ldp     x9, x10, [sp]                           // tile_begin, tile_end
        mov_up  8, 7, 6, 5, 4, 3, 2, 1                  // x1-x7 into x2-x8 (the registers above)
        matmul_body DT_F32, 8
endfunc

/*
 * void gpt2asm_matmul_f16_neon(const uint16_t *w, <as f32>);   w: binary16, widened exactly.
 */
function gpt2asm_matmul_f16_neon, export=1
        ldp     x9, x10, [sp]
        mov_up  8, 7, 6, 5, 4, 3, 2, 1
        matmul_body DT_F16, 7
endfunc
