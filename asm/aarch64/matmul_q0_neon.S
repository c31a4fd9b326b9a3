/*
 * asm/aarch64/matmul_q0_neon.S -- q8_0 / q4_0 batched prefill products (matmul), AArch64 Advanced SIMD:
 * gpt2asm_matmul_{q8_0,q4_0}_neon (base ARMv8.0) and _dotprod (FEAT_DotProd sdot by element).
 * docs/kernels-q0.md is the contract, tests/q0ref.py its numpy model: every (token, output) gets exactly
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
