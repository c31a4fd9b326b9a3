/*
 * asm/aarch64/q6k_neon.h -- the body shared by gpt2asm_matvec_q6_k_neon (matvec_q6k_neon.S, one token) and
 * gpt2asm_matmul_q6_k_neon (matmul_q6k_neon.S, a pair of tokens): one tile's stream of q6_k (llama.cpp
 * Q6_K) super-records, base ARMv8.0 Advanced SIMD only (no dotprod / i8mm / SVE / SME: the sme2 family
 * calls these kernels outside streaming mode for the head).  docs/kernels.md "q6_k" is the contract (tiled
 * layout, per-output sequence), tests/q0ref.py (tile_q6k, matvec_q6k) its numpy model.
 *
 * Per output o and token, for each block b of 32 inputs in order (acc starts at +0.0):
 *     S0  = sum_{i<16} q[32b+i] x[32b+i],  S1 = the same over 16 <= i < 32        exact int32
 *     s   = sc0 * S0 + sc1 * S1                      mul, mla (exact: |s| <= 2^24)
 *     t   = xd[b] * d                                fmul, xd first; d = fcvtl of the binary16 (exact)
 *     acc = fma((float)s, t, acc)                    scvtf (exact), fmla
 * and y = acc + bias (fadd, acc first) at the end of the tile.
 *
 * Integer path.  The 6-bit u = q + 32 (0..63) are dotted with xq (any int8) and S starts at
 * -32 * sum(xq of the half) (K, per block), so S = sum u x - 32 sum x = sum q x exactly:
 *   smull (u of group g, xq group g broadcast) + smlal (group g + 2): two products per int16 lane,
 *   |.| <= 2 * 63 * 128 = 16128; addp: four, <= 32256 < 2^15; sadalp into the int32 S.  Per half two
 *   such sadalp (groups h, h+2 for h = 0, 1).
 * Decoding.  One output vector c (4 outputs, 16 bytes of each group line) is decoded per high-bit vector
 * H_h (h = 0, 1: the 16 bytes at record + 1152 + 256 h + 16 c hold the high 2 bits of groups h, h+2, h+4,
 * h+6 at bits 0-1, 2-3, 4-5, 6-7) with its two nibble vectors Pa = P_h (groups h low nibble, h+4 high) and
 * Pb = P_h+2 (groups h+2, h+6) at record + 128 + 256 g + 16 c:
 *     u_h+4 = ushr Pa, #4 ; bit H, 0x30            u_h   = sli Pa, H, #4 ; and 0x3f
 *     r     = ushr H, #2                           u_h+6 = sri H, Pb, #2 ; ushr #2   (H's top 2 bits kept)
 *     u_h+2 = sli Pb, r, #4 ; and 0x3f             9 instructions per 64 weights
 * The fp32 accumulators (64 per token) live on the stack at sp + ACC6 (output vector c, token k at
 * 16 (ntok c + k)): with 8 broadcast groups of xq per token there are not enough registers for them.
 * Every record is read once per token block, records strictly in address order; inside a record the output
 * vectors in order (quarter by quarter of the tile's 64 outputs: 6 lines of 64 bytes per quarter, as the
 * q4_0 kernels read theirs), the record's sub-scales (its first two lines) and the super-record's d line.
 *
 * Registers (both kernels):
 *     v0-v7 token A's xq groups 0-7 broadcast (X_g, dup .4s)   v8-v15 token B's (matmul)
 *     v16 0x30   v17 0x3f   v18 K = -32 [sum xq[0..16), sum xq[16..32)] of A, then of B (ntok 1: A's twice)
 *     v19, v20 xd[b] of A, B broadcast   v21, v22 S0, S1 of A   v23, v24 S0, S1 of B
 *     v25-v29 Pa/u_h, Pb/u_h+2, H/u_h+6, u_h+4, r; epilogue: sc0, sc1, d, t, acc   v30, v31 int16 products
 *     x13 accumulator cursor   x14 output vectors left   x15 weight cursor (record + 16 c)
 *     x16 sub-scale cursor (record + 4 c)   x17 d cursor (super-record + 8 c)
 *     x19 super-record   x20 super-records left   x21 record   x22 records left in the super-record
 *     x23, x24 xq cursors of A, B   x25, x26 xd cursors of A, B
 */
#ifndef GPT2ASM_Q6K_NEON_H
#define GPT2ASM_Q6K_NEON_H

#define SUPER6  13440           /* bytes per (tile, super-block of 256 inputs): 64 binary16 d, 8 records */
#define RECORD6 1664            /* bytes per (tile, block of 32): 128 sub-scales, 1024 P, 512 H */

/* the 4 groups of one high-bit vector H_h of output vector c (x15 = record + 16 c) -> u_h (v25),
 * u_h+2 (v26), u_h+6 (v27), u_h+4 (v28) */
        .macro  q6k_decode h
        ldr     q25, [x15, #(128 + 256 * \h)]           // Pa = P_h: u_h & 15 | (u_h+4 & 15) << 4
        ldr     q26, [x15, #(128 + 256 * (\h + 2))]     // Pb = P_h+2: groups h+2, h+6
        ldr     q27, [x15, #(1152 + 256 * \h)]          // H_h: u >> 4 of groups h, h+2, h+4, h+6
        ushr    v28.16b, v25.16b, #4
        bit     v28.16b, v27.16b, v16.16b               // u_h+4 = Pa >> 4 | H & 0x30
        sli     v25.16b, v27.16b, #4
        and     v25.16b, v25.16b, v17.16b               // u_h = (Pa & 15 | H << 4) & 0x3f
        ushr    v29.16b, v27.16b, #2                    // r: bits 0-1 = the high bits of group h+2
        sri     v27.16b, v26.16b, #2                    // H & 0xc0 | Pb >> 2
        ushr    v27.16b, v27.16b, #2                    // u_h+6 = (H >> 6) << 4 | Pb >> 4
        sli     v26.16b, v29.16b, #4
        and     v26.16b, v26.16b, v17.16b               // u_h+2 = (Pb & 15 | r << 4) & 0x3f
        .endm

/* one token's sums of the decoded groups: S0 (v\s0) += u_h . X_h + u_h+2 . X_h+2,
 * S1 (v\s1) += u_h+4 . X_h+4 + u_h+6 . X_h+6 (per int32 lane: one output's 16 products) */
        .macro  q6k_dot s0, s1, xa, xc, xe, xg
        smull   v30.8h, v25.8b, v\xa\().8b              // outputs 0, 1 (4 inputs each)
        smlal   v30.8h, v26.8b, v\xc\().8b
        smull2  v31.8h, v25.16b, v\xa\().16b            // outputs 2, 3
        smlal2  v31.8h, v26.16b, v\xc\().16b
        addp    v30.8h, v30.8h, v31.8h                  // 4 products per lane: |.| <= 32256
        sadalp  v\s0\().4s, v30.8h
        smull   v30.8h, v28.8b, v\xe\().8b
        smlal   v30.8h, v27.8b, v\xg\().8b
        smull2  v31.8h, v28.16b, v\xe\().16b
        smlal2  v31.8h, v27.16b, v\xg\().16b
        addp    v30.8h, v30.8h, v31.8h
        sadalp  v\s1\().4s, v30.8h
        .endm

/* one token's fp32 step: s = sc0 S0 + sc1 S1 (sc0 v25, sc1 v26 as int32), t = xd * d (d in v27, fp32),
 * acc (at x13, advanced) = fma((float)s, t, acc) */
        .macro  q6k_epi s0, s1, xd
        mul     v\s0\().4s, v\s0\().4s, v25.4s          // sc0 * S0
        mla     v\s0\().4s, v\s1\().4s, v26.4s          // + sc1 * S1, exact
        scvtf   v\s0\().4s, v\s0\().4s                  // (float)s, exact (|s| <= 2^24)
        fmul    v28.4s, v\xd\().4s, v27.4s              // t = xd[b] * d (xd first)
        ldr     q29, [x13]
        fmla    v29.4s, v\s0\().4s, v28.4s              // acc = fma(s, t, acc)
        str     q29, [x13], #16
        .endm

/* one output vector c (4 outputs) of one record, for ntok tokens; advances x13, x15, x16, x17 */
        .macro  q6k_outvec ntok
        dup     v21.4s, v18.s[0]                        // S0, S1 of A start at -32 sum(xq of the half)
        dup     v22.4s, v18.s[1]
        .if \ntok == 2
        dup     v23.4s, v18.s[2]                        // ... of B
        dup     v24.4s, v18.s[3]
        .endif
        q6k_decode 0                                    // groups 0, 2, 4, 6
        q6k_dot 21, 22, 0, 2, 4, 6
        .if \ntok == 2
        q6k_dot 23, 24, 8, 10, 12, 14
        .endif
        q6k_decode 1                                    // groups 1, 3, 5, 7
        q6k_dot 21, 22, 1, 3, 5, 7
        .if \ntok == 2
        q6k_dot 23, 24, 9, 11, 13, 15
        .endif
        ldr     s26, [x16, #64]                         // sc1 of the 4 outputs (int8)
        ldr     s25, [x16], #4                          // sc0
        ldr     d27, [x17], #8                          // d (binary16)
        add     x15, x15, #16
        sxtl    v25.8h, v25.8b
        sxtl    v26.8h, v26.8b
        sxtl    v25.4s, v25.4h
        sxtl    v26.4s, v26.4h
        fcvtl   v27.4s, v27.4h                          // exact widening
        q6k_epi 21, 22, 19
        .if \ntok == 2
        q6k_epi 23, 24, 20
        .endif
        .endm

/* one record (block b) at x21 of the super-record at x19, for ntok tokens (cursors x23-x26 advanced) */
        .macro  q6k_record ntok
        ld1     {v25.16b, v26.16b}, [x23], #32          // xq[32b .. 32b+31] of A
        .if \ntok == 2
        ld1     {v27.16b, v28.16b}, [x24], #32          // ... of B
        .endif
        dup     v0.4s, v25.s[0]                         // X_g: xq[32b+4g .. +3] in every lane
        dup     v1.4s, v25.s[1]
        dup     v2.4s, v25.s[2]
        dup     v3.4s, v25.s[3]
        dup     v4.4s, v26.s[0]
        dup     v5.4s, v26.s[1]
        dup     v6.4s, v26.s[2]
        dup     v7.4s, v26.s[3]
        saddlp  v29.8h, v25.16b                         // the half sums of xq, exact
        saddlp  v30.8h, v26.16b
        addp    v29.8h, v29.8h, v30.8h                  // A: lanes 0-3 half 0, 4-7 half 1
        .if \ntok == 2
        dup     v8.4s, v27.s[0]
        dup     v9.4s, v27.s[1]
        dup     v10.4s, v27.s[2]
        dup     v11.4s, v27.s[3]
        dup     v12.4s, v28.s[0]
        dup     v13.4s, v28.s[1]
        dup     v14.4s, v28.s[2]
        dup     v15.4s, v28.s[3]
        saddlp  v30.8h, v27.16b
        saddlp  v31.8h, v28.16b
        addp    v30.8h, v30.8h, v31.8h                  // B
        addp    v29.8h, v29.8h, v30.8h                  // A h0, A h1, B h0, B h1 (two lanes each)
        .else
        addp    v29.8h, v29.8h, v29.8h                  // A h0, A h1, A h0, A h1
        .endif
        saddlp  v18.4s, v29.8h                          // [X0, X1] of A, then of B (or A)
        shl     v18.4s, v18.4s, #5
        neg     v18.4s, v18.4s                          // K = -32 X
        ld1r    {v19.4s}, [x25], #4                     // xd[b] of A
        .if \ntok == 2
        ld1r    {v20.4s}, [x26], #4                     // ... of B
        .endif
        mov     x15, x21                                // output vector 0's weights
        mov     x16, x21                                // its sub-scales
        mov     x17, x19                                // its d
        add     x13, sp, #ACC6
        mov     x14, #16
7:                                                      // for each output vector c, in address order
        q6k_outvec \ntok
        subs    x14, x14, #1
        b.ne    7b
        .endm

/* one tile: x19 its first super-record (on return: the next tile's), x20 super-records (nsb), cursors
 * x23-x26 at the rows' starts; leaves the fp32 sums at sp + ACC6 */
        .macro  q6k_tile ntok
        movi    v30.16b, #0                             // acc = +0.0
        add     x13, sp, #ACC6
        mov     x14, #(8 * \ntok)
6:
        stp     q30, q30, [x13], #32
        subs    x14, x14, #1
        b.ne    6b
5:                                                      // for each super-record S
        add     x21, x19, #128                          // its record 0
        mov     x22, #8
4:                                                      // for each record (block b = 8 S + r), in order
        q6k_record \ntok
        add     x21, x21, #RECORD6
        subs    x22, x22, #1
        b.ne    4b
        mov     x19, x21                                // = x19 + SUPER6: the next super-record
        subs    x20, x20, #1
        b.ne    5b
        .endm

#endif /* GPT2ASM_Q6K_NEON_H */
