/*
 * asm/aarch64/matvec_q0_neon.S -- q8_0 / q4_0 matrix-vector products (decode), AArch64 Advanced SIMD:
 * gpt2asm_matvec_{q8_0,q4_0}_neon (base ARMv8.0: smull/addp/sadalp) and _dotprod (FEAT_DotProd: sdot by
 * element).  docs/kernels.md "q8_0 / q4_0" is the contract (layouts, per-output sequence), tests/q0ref.py its
 * numpy model; this file is one macro body per weight type, the two ISAs differing only in the integer
 * dot product of one 16-byte weight vector (4 outputs x 4 consecutive inputs) with one group of 4
 * quantized inputs.
 *
 * Per output o (64 per tile; the tile's 64 fp32 accumulators live in v16-v31 for the whole row):
 *     acc = +0.0
 *     for b in 0 .. nb-1:
 *         s = sum_{i<32} wq[o][32b+i] * xq[32b+i]        int32, exact (any order)
 *         t = xd[b] * dw[o][b]                            fmul (xd first); dw = fcvtl of the binary16
 *         acc = fma((float)s, t, acc)                     scvtf (exact), fmla acc, s, t
 *     y[o] = acc + b[o]                                   fadd (acc first); y[o] = acc without a bias
 *
 * A block's record is processed in quarters of 16 outputs (one 64-byte cache line of each group g at
 * record + 128 + 256 g + 64 q): 4 int32 accumulators v8-v11, then their quarter's epilogue.
 *   q8_0 dotprod: sdot v8+i, w_i, xq.4b[g]                                  (1 instruction / 16 weights)
 *   q8_0 neon:    smull/smull2 with xq's group g broadcast (|w x| <= 128*127), addp (two products:
 *                 |.| <= 32512 fits int16), sadalp into int32                 (4 / 16 weights)
 *   q4_0: the unsigned nibbles u = w + 8 (and 0x0f: group g < 4, ushr #4: group g + 4) are dotted with
 *         xq, and the int32 accumulators start at -8 * sum(xq of the block): s = sum (u - 8) x exactly.
 *         dotprod: two sdot per 16 bytes; neon: smull (group g) + smlal (group g+4) (|.| <= 2*15*127),
 *         addp (<= 7620), sadalp.
 *
 * Registers:
 *     x0 w (argument)   x1 xq   x2 xd   x3 b (+64 tile_begin) or NULL   x4 y (+64 tile_begin)
 *     x5 n_in   x6 tile_begin   x7 tiles left   x8 nb   x9 scratch   x10 xq cursor   x11 xd cursor
 *     x12 record   x13 group cursor   x14 256 (group stride)   x15 blocks left   w16 q4: -8 sum(xq)
 *     v0, v1 the block's 32 xq   v2 xd (broadcast; neon q4: a group of xq)   v3 neon: a group of xq
 *     broadcast; q4: 0x0f   v4-v7 64 weight bytes   v8-v11 int32 sums   v12-v15 scratch
 *     v16-v31 the 64 fp32 accumulators (outputs 4k .. 4k+3 in v16+k)
 */
#include "asm.S"
        .arch_extension dotprod

#define REC_Q8 2176
#define REC_Q4 1152

/* ---- the dot products of one group of one quarter: v8..v11 += w(v4..v7) . xq group ---------------- */

        /* q8_0, one weight vector: neon (xq group broadcast in v3) */
        .macro  dot8_neon acc, w, p0, p1
        smull   v\p0\().8h, v\w\().8b, v3.8b
        smull2  v\p1\().8h, v\w\().16b, v3.16b
        addp    v\p0\().8h, v\p0\().8h, v\p1\().8h
        sadalp  v\acc\().4s, v\p0\().8h
        .endm

        /* q8_0: group g = 4 xr + lane of the block (xq in v0 / v1) */
        .macro  group_q8 dp, xr, lane
        ld1     {v4.16b - v7.16b}, [x13], x14
        .if \dp
        sdot    v8.4s, v4.16b, v\xr\().4b[\lane]
        sdot    v9.4s, v5.16b, v\xr\().4b[\lane]
        sdot    v10.4s, v6.16b, v\xr\().4b[\lane]
        sdot    v11.4s, v7.16b, v\xr\().4b[\lane]
        .else
        dup     v3.4s, v\xr\().s[\lane]
        dot8_neon 8, 4, 12, 13
        dot8_neon 9, 5, 14, 15
        dot8_neon 10, 6, 12, 13
        dot8_neon 11, 7, 14, 15
        .endif
        .endm

        /* q4_0, one packed vector (v\w: low nibbles group g, high nibbles group g + 4) */
        .macro  dot4 dp, acc, w, lane
        ushr    v12.16b, v\w\().16b, #4                 // u of group g + 4
        and     v\w\().16b, v\w\().16b, v3.16b          // u of group g
        .if \dp
        sdot    v\acc\().4s, v\w\().16b, v0.4b[\lane]
        sdot    v\acc\().4s, v12.16b, v1.4b[\lane]
        .else                                           // v2: group g of xq broadcast, v13: group g + 4
        smull   v14.8h, v\w\().8b, v2.8b
        smull2  v15.8h, v\w\().16b, v2.16b
        smlal   v14.8h, v12.8b, v13.8b
        smlal2  v15.8h, v12.16b, v13.16b
        addp    v14.8h, v14.8h, v15.8h
        sadalp  v\acc\().4s, v14.8h
        .endif
        .endm

        .macro  group_q4 dp, lane
        ld1     {v4.16b - v7.16b}, [x13], x14
        .if !\dp
        dup     v2.4s, v0.s[\lane]
        dup     v13.4s, v1.s[\lane]
        .endif
        dot4    \dp, 8, 4, \lane
        dot4    \dp, 9, 5, \lane
        dot4    \dp, 10, 6, \lane
        dot4    \dp, 11, 7, \lane
        .endm

/* ---- one quarter (16 outputs) of one block: int32 sums, then acc = fma((float)s, xd * dw, acc) ------ */

        .macro  quarter kind, dp, q, a0, a1, a2, a3
        .ifc \kind, q4_0
        dup     v8.4s, w16                              // s starts at -8 sum(xq)
        dup     v9.4s, w16
        dup     v10.4s, w16
        dup     v11.4s, w16
        movi    v3.16b, #0x0f
        .else
        movi    v8.4s, #0
        movi    v9.4s, #0
        movi    v10.4s, #0
        movi    v11.4s, #0
        .endif
        add     x13, x12, #128 + 64 * \q                // group 0's line of this quarter
        .ifc \kind, q8_0
        group_q8 \dp, 0, 0
        group_q8 \dp, 0, 1
        group_q8 \dp, 0, 2
        group_q8 \dp, 0, 3
        group_q8 \dp, 1, 0
        group_q8 \dp, 1, 1
        group_q8 \dp, 1, 2
        group_q8 \dp, 1, 3
        .else
        group_q4 \dp, 0
        group_q4 \dp, 1
        group_q4 \dp, 2
        group_q4 \dp, 3
        .endif
        ldr     q12, [x12, #32 * \q]                    // dw of outputs 16q .. 16q+7
        ldr     q13, [x12, #32 * \q + 16]               // ... 16q+8 .. 16q+15
        ld1r    {v2.4s}, [x11]                          // xd[b]
        fcvtl   v14.4s, v12.4h                          // exact widening
        fcvtl2  v15.4s, v12.8h
        fcvtl   v12.4s, v13.4h
        fcvtl2  v13.4s, v13.8h
        fmul    v14.4s, v2.4s, v14.4s                   // t = xd[b] * dw
        fmul    v15.4s, v2.4s, v15.4s
        fmul    v12.4s, v2.4s, v12.4s
        fmul    v13.4s, v2.4s, v13.4s
        scvtf   v8.4s, v8.4s                            // (float)s, exact (|s| < 2^24)
        scvtf   v9.4s, v9.4s
        scvtf   v10.4s, v10.4s
        scvtf   v11.4s, v11.4s
        fmla    v\a0\().4s, v8.4s, v14.4s               // acc = fma(s, t, acc)
        fmla    v\a1\().4s, v9.4s, v15.4s
        fmla    v\a2\().4s, v10.4s, v12.4s
        fmla    v\a3\().4s, v11.4s, v13.4s
        .endm

/* ---- the whole kernel ------------------------------------------------------------------------------ */

        .macro  matvec_q0 kind, isa, dp, rec
function gpt2asm_matvec_\kind\()_\isa, export=1
        subs    x7, x7, x6                              // tiles = tile_end - tile_begin ...
        b.ls    9f                                      // ... nothing when tile_end <= tile_begin
        lsr     x8, x5, #5                              // nb
        cbz     x8, 9f                                  // (n_in = 0: no valid matrix; nothing)
        sub     sp, sp, #64
        callee_d8_d15 stp, 0
        lsl     x9, x6, #8                              // 64 floats = 256 bytes per tile
        add     x4, x4, x9                              // y += 64 tile_begin
        cbz     x3, 1f
        add     x3, x3, x9                              // b += 64 tile_begin (only if non-NULL)
1:
        mul     x9, x6, x8                              // tile_begin * nb records
        mov     x15, #\rec
        madd    x12, x9, x15, x0                        // the first record of tile tile_begin
        mov     x14, #256
2:                                                      // for each tile
        movi    v16.4s, #0                              // acc = +0.0
        movi    v17.4s, #0
        movi    v18.4s, #0
        movi    v19.4s, #0
        movi    v20.4s, #0
        movi    v21.4s, #0
        movi    v22.4s, #0
        movi    v23.4s, #0
        movi    v24.4s, #0
        movi    v25.4s, #0
        movi    v26.4s, #0
        movi    v27.4s, #0
        movi    v28.4s, #0
        movi    v29.4s, #0
        movi    v30.4s, #0
        movi    v31.4s, #0
        mov     x10, x1                                 // xq cursor
        mov     x11, x2                                 // xd cursor
        mov     x15, x8                                 // blocks left
3:                                                      // for each block, in input order
        ld1     {v0.16b, v1.16b}, [x10], #32            // xq[32b .. 32b+31]
        .ifc \kind, q4_0
        saddlp  v12.8h, v0.16b                          // sum(xq) of the block, exact
        sadalp  v12.8h, v1.16b
        saddlv  s12, v12.8h
        fmov    w16, s12
        neg     w16, w16, lsl #3                        // -8 sum(xq)
        .endif
        quarter \kind, \dp, 0, 16, 17, 18, 19
        quarter \kind, \dp, 1, 20, 21, 22, 23
        quarter \kind, \dp, 2, 24, 25, 26, 27
        quarter \kind, \dp, 3, 28, 29, 30, 31
        add     x11, x11, #4
        add     x12, x12, #\rec                         // the next record (the next tile's after the last)
        subs    x15, x15, #1
        b.ne    3b
        cbz     x3, 4f
        ld1     {v4.4s - v7.4s}, [x3], #64              // y = acc + b
        fadd    v16.4s, v16.4s, v4.4s
        fadd    v17.4s, v17.4s, v5.4s
        fadd    v18.4s, v18.4s, v6.4s
        fadd    v19.4s, v19.4s, v7.4s
        ld1     {v4.4s - v7.4s}, [x3], #64
        fadd    v20.4s, v20.4s, v4.4s
        fadd    v21.4s, v21.4s, v5.4s
        fadd    v22.4s, v22.4s, v6.4s
        fadd    v23.4s, v23.4s, v7.4s
        ld1     {v4.4s - v7.4s}, [x3], #64
        fadd    v24.4s, v24.4s, v4.4s
        fadd    v25.4s, v25.4s, v5.4s
        fadd    v26.4s, v26.4s, v6.4s
        fadd    v27.4s, v27.4s, v7.4s
        ld1     {v4.4s - v7.4s}, [x3], #64
        fadd    v28.4s, v28.4s, v4.4s
        fadd    v29.4s, v29.4s, v5.4s
        fadd    v30.4s, v30.4s, v6.4s
        fadd    v31.4s, v31.4s, v7.4s
4:
        st1     {v16.4s - v19.4s}, [x4], #64
        st1     {v20.4s - v23.4s}, [x4], #64
        st1     {v24.4s - v27.4s}, [x4], #64
        st1     {v28.4s - v31.4s}, [x4], #64
        subs    x7, x7, #1
        b.ne    2b
        callee_d8_d15 ldp, 0
        add     sp, sp, #64
9:
        ret
endfunc
        .endm

/*
 * void gpt2asm_matvec_q8_0_<isa>(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
 *                                float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 * void gpt2asm_matvec_q4_0_<isa>(the same);                                        isa: neon, dotprod
 *
 *   y[o] for 64 tile_begin <= o < 64 tile_end by the sequence above; w: the tiled records
 *   (docs/kernels.md "q8_0 / q4_0"), 64-byte aligned; xq[n_in], xd[n_in / 32], b (NULL or absolute outputs), y:
 *   any alignment.  Reads only the records of tiles tile_begin .. tile_end-1.
 */
        matvec_q0 q8_0, neon, 0, REC_Q8
        matvec_q0 q8_0, dotprod, 1, REC_Q8
        matvec_q0 q4_0, neon, 0, REC_Q4
        matvec_q0 q4_0, dotprod, 1, REC_Q4
