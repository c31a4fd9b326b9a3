/*
 * asm/aarch64/matmul_q0_neon.S -- q8_0 / q4_0 batched prefill products (matmul), AArch64 Advanced SIMD:
 * gpt2asm_matmul_{q8_0,q4_0}_neon (base ARMv8.0) and _dotprod (FEAT_DotProd sdot by element).
 * docs/kernels.md "q8_0 / q4_0" is the contract, tests/q0ref.py its numpy model: every (token, output) gets exactly
 * the operation sequence (and so the bits) of gpt2asm_matvec_<kind>_<isa> on that token's row:
 *     acc = +0.0;  for b in order:  s = exact int32 block sum;  t = xd[b] * dw;  acc = fma((float)s, t, acc)
 *     y = acc + bias (fadd, acc first; y = acc without a bias)
 *
 * Register blocking: 2 tokens x 16 outputs (a quarter of a tile).  For each tile, each pair of tokens and
 * each quarter q, the blocks are streamed in order: the quarter's line of each group (record + 128 +
 * 256 g + 64 q, 64 bytes) is loaded once and dotted with both tokens' quantized inputs (the integer
 * kernels of matvec_q0_neon.S, twice), then each token's int32 sums go through the quarter's epilogue.
 * A tile's records stay in cache between its token pairs.  An odd last token runs as a pair with
 * itself; only its first row is stored.
 *
 * Registers:
 *     x0 w   x1 xq   x2 ldq (bytes)   x3 xd   x4 ldd (bytes)   x5 b or NULL   x6 y   x7 ldy (bytes)
 *     x8 n_tokens   x9 nb   x10 tile   x11 tile_end   x12 the tile's first record   x13 token (A)
 *     x14 64 q   x15 record cursor / scratch   x16 group cursor / scratch   x17 256 (group stride)
 *     x19, x20 xq cursors A, B   x21, x22 xd cursors A, B   x23 blocks left   x24 token B is real
 *     x25, x26 token A's xq and xd rows   w27, w28 q4: -8 sum(xq) of the block, tokens A and B
 *     v0, v1 token A's 32 xq   v2, v3 token B's   v4-v7 64 weight bytes (epilogue: xd A, xd B)
 *     v8-v11, v12-v15 int32 sums A, B   v16-v19, v20-v23 fp32 accumulators A, B
 *     v24-v31 scratch (broadcast groups of xq, the 0x0f mask, nibbles, products; epilogue: dw, t)
 */
#include "asm.S"
        .arch_extension dotprod

#define REC_Q8 2176
#define REC_Q4 1152

        /* acc += the 16 weight bytes in v\w dotted with the group of xq broadcast in v\xg (neon) */
        .macro  dot8_neon acc, w, xg
        smull   v30.8h, v\w\().8b, v\xg\().8b
        smull2  v31.8h, v\w\().16b, v\xg\().16b
        addp    v30.8h, v30.8h, v31.8h
        sadalp  v\acc\().4s, v30.8h
        .endm

        .macro  group_q8 dp, xr, xb, lane
        ld1     {v4.16b - v7.16b}, [x16], x17
        .if \dp
        sdot    v8.4s, v4.16b, v\xr\().4b[\lane]
        sdot    v12.4s, v4.16b, v\xb\().4b[\lane]
        sdot    v9.4s, v5.16b, v\xr\().4b[\lane]
        sdot    v13.4s, v5.16b, v\xb\().4b[\lane]
        sdot    v10.4s, v6.16b, v\xr\().4b[\lane]
        sdot    v14.4s, v6.16b, v\xb\().4b[\lane]
        sdot    v11.4s, v7.16b, v\xr\().4b[\lane]
        sdot    v15.4s, v7.16b, v\xb\().4b[\lane]
        .else
        dup     v24.4s, v\xr\().s[\lane]
        dup     v25.4s, v\xb\().s[\lane]
        dot8_neon 8, 4, 24
        dot8_neon 12, 4, 25
        dot8_neon 9, 5, 24
        dot8_neon 13, 5, 25
        dot8_neon 10, 6, 24
        dot8_neon 14, 6, 25
        dot8_neon 11, 7, 24
        dot8_neon 15, 7, 25
        .endif
        .endm

        /* q4_0: v\w packed (low nibbles: group g, high: group g + 4); mask 0x0f in v24 */
        .macro  dot4 dp, a, bb, w, lane
        ushr    v29.16b, v\w\().16b, #4
        and     v\w\().16b, v\w\().16b, v24.16b
        .if \dp
        sdot    v\a\().4s, v\w\().16b, v0.4b[\lane]
        sdot    v\a\().4s, v29.16b, v1.4b[\lane]
        sdot    v\bb\().4s, v\w\().16b, v2.4b[\lane]
        sdot    v\bb\().4s, v29.16b, v3.4b[\lane]
        .else                                   // v25/v26: token A's groups g / g+4, v27/v28: token B's
        smull   v30.8h, v\w\().8b, v25.8b
        smull2  v31.8h, v\w\().16b, v25.16b
        smlal   v30.8h, v29.8b, v26.8b
        smlal2  v31.8h, v29.16b, v26.16b
        addp    v30.8h, v30.8h, v31.8h
        sadalp  v\a\().4s, v30.8h
        smull   v30.8h, v\w\().8b, v27.8b
        smull2  v31.8h, v\w\().16b, v27.16b
        smlal   v30.8h, v29.8b, v28.8b
        smlal2  v31.8h, v29.16b, v28.16b
        addp    v30.8h, v30.8h, v31.8h
        sadalp  v\bb\().4s, v30.8h
        .endif
        .endm

        .macro  group_q4 dp, lane
        ld1     {v4.16b - v7.16b}, [x16], x17
        .if !\dp
        dup     v25.4s, v0.s[\lane]
        dup     v26.4s, v1.s[\lane]
        dup     v27.4s, v2.s[\lane]
        dup     v28.4s, v3.s[\lane]
        .endif
        dot4    \dp, 8, 12, 4, \lane
        dot4    \dp, 9, 13, 5, \lane
        dot4    \dp, 10, 14, 6, \lane
        dot4    \dp, 11, 15, 7, \lane
        .endm

        /* y[16] (at x15) = acc (v\a0 .. v\a0+3) + b (at x16, if x5 != 0) */
        .macro  store16 a0, a1, a2, a3
        cbz     x5, 7f
        ld1     {v24.4s - v27.4s}, [x16]
        fadd    v\a0\().4s, v\a0\().4s, v24.4s
        fadd    v\a1\().4s, v\a1\().4s, v25.4s
        fadd    v\a2\().4s, v\a2\().4s, v26.4s
        fadd    v\a3\().4s, v\a3\().4s, v27.4s
7:
        st1     {v\a0\().4s - v\a3\().4s}, [x15]
        .endm

        .macro  matmul_q0 kind, isa, dp, rec
function gpt2asm_matmul_\kind\()_\isa, export=1
        ldp     x8, x9, [sp]                            // n_tokens, n_in
        ldp     x10, x11, [sp, #16]                     // tile_begin, tile_end
        cmp     x10, x11
        b.hs    9f                                      // an empty tile range
        cbz     x8, 9f                                  // no tokens
        lsr     x9, x9, #5                              // nb
        cbz     x9, 9f
        sub     sp, sp, #160
        callee_x19_x28 stp, 0
        callee_d8_d15 stp, 80
        lsl     x4, x4, #2                              // ldd, ldy: floats -> bytes
        lsl     x7, x7, #2
        mov     x17, #256
        mov     x15, #\rec
        mul     x12, x10, x9
        madd    x12, x12, x15, x0                       // the first record of tile tile_begin
1:                                                      // for each tile
        mov     x13, #0                                 // token A
        mov     x25, x1
        mov     x26, x3
2:                                                      // for each pair of tokens (A, B)
        add     x15, x13, #1
        cmp     x15, x8
        cset    x24, lo                                 // token B exists?
        mov     x14, #0                                 // quarter offset 64 q
3:                                                      // for each quarter
        movi    v16.4s, #0                              // acc = +0.0
        movi    v17.4s, #0
        movi    v18.4s, #0
        movi    v19.4s, #0
        movi    v20.4s, #0
        movi    v21.4s, #0
        movi    v22.4s, #0
        movi    v23.4s, #0
        mov     x19, x25                                // token A's cursors
        mov     x21, x26
        mov     x20, x25                                // token B's: A's row (an odd last token) ...
        mov     x22, x26
        cbz     x24, 4f
        add     x20, x25, x2                            // ... or the next row
        add     x22, x26, x4
4:
        mov     x15, x12                                // record cursor
        mov     x23, x9                                 // blocks left
5:                                                      // for each block, in input order
        ld1     {v0.16b, v1.16b}, [x19], #32            // xq of token A
        ld1     {v2.16b, v3.16b}, [x20], #32            // xq of token B
        .ifc \kind, q4_0
        saddlp  v30.8h, v0.16b                          // -8 sum(xq) per token, exact
        sadalp  v30.8h, v1.16b
        saddlp  v31.8h, v2.16b
        sadalp  v31.8h, v3.16b
        saddlv  s30, v30.8h
        saddlv  s31, v31.8h
        fmov    w27, s30
        fmov    w28, s31
        neg     w27, w27, lsl #3
        neg     w28, w28, lsl #3
        dup     v8.4s, w27
        dup     v9.4s, w27
        dup     v10.4s, w27
        dup     v11.4s, w27
        dup     v12.4s, w28
        dup     v13.4s, w28
        dup     v14.4s, w28
        dup     v15.4s, w28
        movi    v24.16b, #0x0f
        .else
        movi    v8.4s, #0
        movi    v9.4s, #0
        movi    v10.4s, #0
        movi    v11.4s, #0
        movi    v12.4s, #0
        movi    v13.4s, #0
        movi    v14.4s, #0
        movi    v15.4s, #0
        .endif
        add     x16, x15, x14
        add     x16, x16, #128                          // group 0's line of the quarter
        .ifc \kind, q8_0
        group_q8 \dp, 0, 2, 0
        group_q8 \dp, 0, 2, 1
        group_q8 \dp, 0, 2, 2
        group_q8 \dp, 0, 2, 3
        group_q8 \dp, 1, 3, 0
        group_q8 \dp, 1, 3, 1
        group_q8 \dp, 1, 3, 2
        group_q8 \dp, 1, 3, 3
        .else
        group_q4 \dp, 0
        group_q4 \dp, 1
        group_q4 \dp, 2
        group_q4 \dp, 3
        .endif
        add     x16, x15, x14, lsr #1                   // the quarter's 16 binary16 scales
        ldp     q24, q25, [x16]
        ld1r    {v4.4s}, [x21], #4                      // xd[b] of token A
        ld1r    {v5.4s}, [x22], #4                      // ... of token B
        fcvtl   v26.4s, v24.4h                          // dw, exact
        fcvtl2  v27.4s, v24.8h
        fcvtl   v24.4s, v25.4h
        fcvtl2  v25.4s, v25.8h
        fmul    v28.4s, v4.4s, v26.4s                   // t = xd[b] * dw (token A)
        fmul    v29.4s, v4.4s, v27.4s
        fmul    v30.4s, v4.4s, v24.4s
        fmul    v31.4s, v4.4s, v25.4s
        scvtf   v8.4s, v8.4s                            // (float)s, exact
        scvtf   v9.4s, v9.4s
        scvtf   v10.4s, v10.4s
        scvtf   v11.4s, v11.4s
        fmla    v16.4s, v8.4s, v28.4s                   // acc = fma(s, t, acc)
        fmla    v17.4s, v9.4s, v29.4s
        fmla    v18.4s, v10.4s, v30.4s
        fmla    v19.4s, v11.4s, v31.4s
        fmul    v28.4s, v5.4s, v26.4s                   // token B
        fmul    v29.4s, v5.4s, v27.4s
        fmul    v30.4s, v5.4s, v24.4s
        fmul    v31.4s, v5.4s, v25.4s
        scvtf   v12.4s, v12.4s
        scvtf   v13.4s, v13.4s
        scvtf   v14.4s, v14.4s
        scvtf   v15.4s, v15.4s
        fmla    v20.4s, v12.4s, v28.4s
        fmla    v21.4s, v13.4s, v29.4s
        fmla    v22.4s, v14.4s, v30.4s
        fmla    v23.4s, v15.4s, v31.4s
        add     x15, x15, #\rec
        subs    x23, x23, #1
        b.ne    5b
        lsl     x16, x10, #8                            // 64 floats of a tile = 256 bytes, + 64 q ...
        add     x16, x16, x14                           // ... = byte offset of the 16 outputs in a row
        add     x15, x6, x16
        madd    x15, x13, x7, x15                       // &y[A][64 tile + 16 q]
        add     x16, x5, x16                            // &b[64 tile + 16 q] (unused when b is NULL)
        store16 16, 17, 18, 19
        cbz     x24, 6f
        add     x15, x15, x7                            // &y[B][...]
        store16 20, 21, 22, 23
6:
        add     x14, x14, #64
        cmp     x14, #256
        b.lo    3b
        add     x13, x13, #2                            // the next pair of tokens
        add     x25, x25, x2, lsl #1
        add     x26, x26, x4, lsl #1
        cmp     x13, x8
        b.lo    2b
        mov     x15, #\rec                              // the next tile
        madd    x12, x9, x15, x12
        add     x10, x10, #1
        cmp     x10, x11
        b.lo    1b
        callee_d8_d15 ldp, 80
        callee_x19_x28 ldp, 0
        add     sp, sp, #160
9:
        ret
endfunc
        .endm

/*
 * void gpt2asm_matmul_q8_0_<isa>(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd,
 *                                size_t ldd, const float *b, float *y, size_t ldy, size_t n_tokens,
 *                                size_t n_in, size_t tile_begin, size_t tile_end);
 * void gpt2asm_matmul_q4_0_<isa>(the same);                                        isa: neon, dotprod
 *
 *   for t < n_tokens and 64 tile_begin <= o < 64 tile_end: y[t ldy + o] = the matvec sequence on token
 *   t's row (xq[t ldq + i], xd[t ldd + b]).  w: the tiled records, 64-byte aligned; xq, xd, b (NULL or
 *   absolute outputs), y: any alignment.  Reads only the records of tiles tile_begin .. tile_end-1 and
 *   the n_tokens rows; n_tokens = 0 or an empty tile range does nothing.
 */
        matmul_q0 q8_0, neon, 0, REC_Q8
        matmul_q0 q8_0, dotprod, 1, REC_Q8
        matmul_q0 q4_0, neon, 0, REC_Q4
        matmul_q0 q4_0, dotprod, 1, REC_Q4

/* ---------------------------------------------------------------------------------------------------- */
/*
 * gpt2asm_matmul_{q8_0,q4_0}_i8mm: FEAT_I8MM smmla (2 x 8 by 8 x 2 int8 -> 2 x 2 int32), register-blocked
 * 4 tokens x 8 outputs (an eighth of a tile: 32 bytes of each group's 256).  Per group pair (g, g+1) the
 * two groups' weight vectors are interleaved by zip1/zip2 .4s into rows of 8 consecutive inputs of two
 * outputs, the tokens' xq by zip1/zip2 .2d into rows of 8 inputs of two tokens (once per block); smmla
 * gives [o A, o B, o+1 A, o+1 B] sums, uzp1/uzp2 put them back in output order per token before the same
 * epilogue as above.  q4_0: the nibbles as for the other variants (ushr #4; shl #4 + ushr #4), sums
 * started at -8 sum(xq) per token.
 *
 * Registers (others as for the 2-token kernels):
 *     x19-x22 xq cursors A-D   x23-x26 xd cursors A-D   x27 blocks left   x28 tokens in the quad (1..4)
 *     x14 32 e (the eighth)   x16 group cursor   x17 scratch
 *     v24-v27 xq rows (A, B) of group pairs 01, 23, 45, 67   v28-v31 the same for (C, D)
 *     v8-v11 int32 [o A, o B, o+1 A, o+1 B] for output pairs 0-3, v12-v15 for (C, D)
 *     v16/v17, v18/v19, v20/v21, v22/v23 fp32 accumulators of tokens A, B, C, D   v0-v7 weights, scratch
 */
        .arch_extension i8mm

        /* the weights of group pair (g, g+1) for the eighth, 8 outputs: Wg in v\a0, v\a1 (outputs 0-3,
         * 4-7), Wg1 in v\b0, v\b1 -> rows of output pairs 0..3 in v4..v7, then 8 smmla */
        .macro  mm_pair a0, a1, b0, b1, xab, xcd
        zip1    v4.4s, v\a0\().4s, v\b0\().4s
        zip2    v5.4s, v\a0\().4s, v\b0\().4s
        zip1    v6.4s, v\a1\().4s, v\b1\().4s
        zip2    v7.4s, v\a1\().4s, v\b1\().4s
        smmla   v8.4s, v4.16b, v\xab\().16b
        smmla   v12.4s, v4.16b, v\xcd\().16b
        smmla   v9.4s, v5.16b, v\xab\().16b
        smmla   v13.4s, v5.16b, v\xcd\().16b
        smmla   v10.4s, v6.16b, v\xab\().16b
        smmla   v14.4s, v6.16b, v\xcd\().16b
        smmla   v11.4s, v7.16b, v\xab\().16b
        smmla   v15.4s, v7.16b, v\xcd\().16b
        .endm

        /* half of mm_pair: the weights of one group pair for 4 outputs in v\a, v\b -> 4 smmla into the
         * int32 sums v\p0, v\p1 (tokens A, B) and v\q0, v\q1 (C, D) */
        .macro  mm_half p0, p1, q0, q1, a, b, xab, xcd
        zip1    v6.4s, v\a\().4s, v\b\().4s
        zip2    v7.4s, v\a\().4s, v\b\().4s
        smmla   v\p0\().4s, v6.16b, v\xab\().16b
        smmla   v\q0\().4s, v6.16b, v\xcd\().16b
        smmla   v\p1\().4s, v7.16b, v\xab\().16b
        smmla   v\q1\().4s, v7.16b, v\xcd\().16b
        .endm

        /* q4_0: P_g in v0, v1 and P_g+1 in v2, v3 (g = 0 or 2): the high nibbles (groups g+4, g+5) against
         * the xq rows v\hab, v\hcd, then the low nibbles (groups g, g+1) against v\lab, v\lcd */
        .macro  q4_pairs lab, lcd, hab, hcd
        ushr    v4.16b, v0.16b, #4
        ushr    v5.16b, v2.16b, #4
        mm_half 8, 9, 12, 13, 4, 5, \hab, \hcd
        ushr    v4.16b, v1.16b, #4
        ushr    v5.16b, v3.16b, #4
        mm_half 10, 11, 14, 15, 4, 5, \hab, \hcd
        shl     v0.16b, v0.16b, #4
        shl     v1.16b, v1.16b, #4
        shl     v2.16b, v2.16b, #4
        shl     v3.16b, v3.16b, #4
        ushr    v0.16b, v0.16b, #4
        ushr    v1.16b, v1.16b, #4
        ushr    v2.16b, v2.16b, #4
        ushr    v3.16b, v3.16b, #4
        mm_pair 0, 1, 2, 3, \lab, \lcd
        .endm

        /* acc (v\f0, v\f1: 8 outputs of one token) = fma((float)s, xd * dw, acc); s in v\s0, v\s1 (int32,
         * output order); dw in v1 (outputs 0-3), v2 (4-7); xd at [x\xd], advanced */
        .macro  mm_epi s0, s1, f0, f1, xd
        scvtf   v\s0\().4s, v\s0\().4s
        scvtf   v\s1\().4s, v\s1\().4s
        ld1r    {v7.4s}, [x\xd], #4
        fmul    v0.4s, v7.4s, v1.4s
        fmul    v7.4s, v7.4s, v2.4s
        fmla    v\f0\().4s, v\s0\().4s, v0.4s
        fmla    v\f1\().4s, v\s1\().4s, v7.4s
        .endm

        /* y[8] (at x17) = acc + b (at x16 if x5 != 0) */
        .macro  store8 f0, f1
        cbz     x5, 7f
        ld1     {v0.4s, v1.4s}, [x16]
        fadd    v\f0\().4s, v\f0\().4s, v0.4s
        fadd    v\f1\().4s, v\f1\().4s, v1.4s
7:
        st1     {v\f0\().4s, v\f1\().4s}, [x17]
        .endm

        .macro  matmul_q0_i8mm kind, rec
function gpt2asm_matmul_\kind\()_i8mm, export=1
        ldp     x8, x9, [sp]                            // n_tokens, n_in
        ldp     x10, x11, [sp, #16]                     // tile_begin, tile_end
        cmp     x10, x11
        b.hs    9f
        cbz     x8, 9f
        lsr     x9, x9, #5                              // nb
        cbz     x9, 9f
        sub     sp, sp, #160
        callee_x19_x28 stp, 0
        callee_d8_d15 stp, 80
        lsl     x4, x4, #2                              // ldd, ldy: floats -> bytes
        lsl     x7, x7, #2
        mov     x15, #\rec
        mul     x12, x10, x9
        madd    x12, x12, x15, x0                       // the first record of tile tile_begin
1:                                                      // for each tile
        mov     x13, #0                                 // token A of the quad
2:                                                      // for each quad of tokens
        sub     x28, x8, x13
        cmp     x28, #4
        mov     x17, #4
        csel    x28, x28, x17, lo                       // tokens in the quad
        mov     x14, #0                                 // 32 e
3:                                                      // for each eighth
        movi    v16.4s, #0                              // acc = +0.0
        movi    v17.4s, #0
        movi    v18.4s, #0
        movi    v19.4s, #0
        movi    v20.4s, #0
        movi    v21.4s, #0
        movi    v22.4s, #0
        movi    v23.4s, #0
        madd    x19, x13, x2, x1                        // xq row A; rows B-D (A's if absent)
        mul     x17, x13, x4
        add     x23, x3, x17                            // xd row A
        cmp     x28, #2
        add     x20, x19, x2
        add     x24, x23, x4
        csel    x20, x20, x19, hs
        csel    x24, x24, x23, hs
        cmp     x28, #3
        add     x21, x19, x2, lsl #1
        add     x25, x23, x4, lsl #1
        csel    x21, x21, x19, hs
        csel    x25, x25, x23, hs
        cmp     x28, #4
        add     x22, x21, x2
        add     x26, x25, x4
        csel    x22, x22, x19, hs
        csel    x26, x26, x23, hs
        mov     x15, x12                                // record cursor
        mov     x27, x9                                 // blocks left
4:                                                      // for each block, in input order
        ld1     {v0.16b, v1.16b}, [x19], #32            // xq A
        ld1     {v2.16b, v3.16b}, [x20], #32            // xq B
        ld1     {v4.16b, v5.16b}, [x21], #32            // xq C
        ld1     {v6.16b, v7.16b}, [x22], #32            // xq D
        zip1    v24.2d, v0.2d, v2.2d                    // (A, B) rows of inputs 0-7
        zip2    v25.2d, v0.2d, v2.2d                    // 8-15
        zip1    v26.2d, v1.2d, v3.2d                    // 16-23
        zip2    v27.2d, v1.2d, v3.2d                    // 24-31
        zip1    v28.2d, v4.2d, v6.2d                    // (C, D)
        zip2    v29.2d, v4.2d, v6.2d
        zip1    v30.2d, v5.2d, v7.2d
        zip2    v31.2d, v5.2d, v7.2d
        .ifc \kind, q4_0
        saddlp  v8.8h, v0.16b                           // [-8 sum A, -8 sum B] twice, exact
        sadalp  v8.8h, v1.16b
        saddlv  s8, v8.8h
        saddlp  v9.8h, v2.16b
        sadalp  v9.8h, v3.16b
        saddlv  s9, v9.8h
        zip1    v8.4s, v8.4s, v9.4s
        zip1    v8.2d, v8.2d, v8.2d
        shl     v8.4s, v8.4s, #3
        neg     v8.4s, v8.4s
        saddlp  v12.8h, v4.16b                          // ... C, D
        sadalp  v12.8h, v5.16b
        saddlv  s12, v12.8h
        saddlp  v13.8h, v6.16b
        sadalp  v13.8h, v7.16b
        saddlv  s13, v13.8h
        zip1    v12.4s, v12.4s, v13.4s
        zip1    v12.2d, v12.2d, v12.2d
        shl     v12.4s, v12.4s, #3
        neg     v12.4s, v12.4s
        mov     v9.16b, v8.16b
        mov     v10.16b, v8.16b
        mov     v11.16b, v8.16b
        mov     v13.16b, v12.16b
        mov     v14.16b, v12.16b
        mov     v15.16b, v12.16b
        add     x16, x15, x14
        add     x16, x16, #128                          // P of group 0, the eighth's 32 bytes
        ldp     q0, q1, [x16]                           // P0: groups 0 (low) and 4 (high)
        ldp     q2, q3, [x16, #256]                     // P1: groups 1 and 5
        q4_pairs 24, 28, 26, 30
        ldp     q0, q1, [x16, #512]                     // P2: groups 2 and 6
        ldp     q2, q3, [x16, #768]                     // P3: groups 3 and 7
        q4_pairs 25, 29, 27, 31
        .else
        movi    v8.4s, #0
        movi    v9.4s, #0
        movi    v10.4s, #0
        movi    v11.4s, #0
        movi    v12.4s, #0
        movi    v13.4s, #0
        movi    v14.4s, #0
        movi    v15.4s, #0
        add     x16, x15, x14
        add     x16, x16, #128                          // group 0, the eighth's 32 bytes
        ldp     q0, q1, [x16]                           // group 0
        ldp     q2, q3, [x16, #256]                     // group 1
        mm_pair 0, 1, 2, 3, 24, 28
        ldp     q0, q1, [x16, #512]
        ldp     q2, q3, [x16, #768]
        mm_pair 0, 1, 2, 3, 25, 29
        add     x16, x16, #1024
        ldp     q0, q1, [x16]
        ldp     q2, q3, [x16, #256]
        mm_pair 0, 1, 2, 3, 26, 30
        ldp     q0, q1, [x16, #512]
        ldp     q2, q3, [x16, #768]
        mm_pair 0, 1, 2, 3, 27, 31
        .endif
        add     x16, x15, x14, lsr #1                   // the eighth's 8 binary16 scales (16 e bytes)
        ldr     q0, [x16]
        fcvtl   v1.4s, v0.4h                            // dw 0-3, exact
        fcvtl2  v2.4s, v0.8h                            // dw 4-7
        uzp1    v3.4s, v8.4s, v9.4s                     // A: outputs 0-3
        uzp2    v4.4s, v8.4s, v9.4s                     // B
        uzp1    v5.4s, v10.4s, v11.4s                   // A: 4-7
        uzp2    v6.4s, v10.4s, v11.4s                   // B
        mm_epi  3, 5, 16, 17, 23
        mm_epi  4, 6, 18, 19, 24
        uzp1    v3.4s, v12.4s, v13.4s                   // C
        uzp2    v4.4s, v12.4s, v13.4s                   // D
        uzp1    v5.4s, v14.4s, v15.4s
        uzp2    v6.4s, v14.4s, v15.4s
        mm_epi  3, 5, 20, 21, 25
        mm_epi  4, 6, 22, 23, 26
        add     x15, x15, #\rec
        subs    x27, x27, #1
        b.ne    4b
        lsl     x16, x10, #8
        add     x16, x16, x14                           // byte offset of the 8 outputs in a row
        add     x17, x6, x16
        madd    x17, x13, x7, x17                       // &y[A][64 tile + 8 e]
        add     x16, x5, x16                            // &b[...]
        store8  16, 17
        cmp     x28, #2
        b.lo    6f
        add     x17, x17, x7
        store8  18, 19
        cmp     x28, #3
        b.lo    6f
        add     x17, x17, x7
        store8  20, 21
        cmp     x28, #4
        b.lo    6f
        add     x17, x17, x7
        store8  22, 23
6:
        add     x14, x14, #32
        cmp     x14, #256
        b.lo    3b
        add     x13, x13, #4                            // the next quad of tokens
        cmp     x13, x8
        b.lo    2b
        mov     x15, #\rec                              // the next tile
        madd    x12, x9, x15, x12
        add     x10, x10, #1
        cmp     x10, x11
        b.lo    1b
        callee_d8_d15 ldp, 80
        callee_x19_x28 ldp, 0
        add     sp, sp, #160
9:
        ret
endfunc
        .endm

        matmul_q0_i8mm q8_0, REC_Q8
        matmul_q0_i8mm q4_0, REC_Q4
