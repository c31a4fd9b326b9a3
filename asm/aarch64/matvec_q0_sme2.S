/*
 * asm/aarch64/matvec_q0_sme2.S -- q8_0 / q4_0 matrix-vector products (decode) with SME2 multi-vector
 * int8 dot products into ZA: gpt2asm_matvec_{q8_0,q4_0}_sme2.  docs/kernels.md "q8_0 / q4_0" is the contract,
 * tests/q0ref.py its numpy model; the outputs are the bits of gpt2asm_matvec_<kind>_{neon,dotprod}:
 *     acc = +0.0;  for b in order:  s = exact int32 block sum;  t = xd[b] * dw;  acc = fma((float)s, t, acc)
 *     y = acc + bias (one fadd, acc first; y = acc without a bias)
 *
 * How (SVL_B = streaming vector bytes, V = SVL_B / 4 lanes of 32 bits; NC = 256 / (4 SVL_B) = 1, 2, 4 at
 * SVL 512, 256, 128 -- one code path each):
 *   a group g of a record (256 bytes: 64 outputs x 4 consecutive inputs, docs/kernels.md "q8_0 / q4_0") is NC
 *   4-register multi-vector loads; `sdot za.s[w11, k, vgx4], {z0.b-z3.b}, z4.b[g]` adds, for each 32-bit
 *   lane (one output), the dot of its 4 weights with xq's group g (element g of each 128-bit segment
 *   of z4 = xq[0..15] replicated by ld1rqb; z5 = xq[16..31] for groups 4-7) into ZA array vectors k,
 *   k + SVL_B/4, k + SVL_B/2, k + 3 SVL_B/4 ("slot" k: chunk k's outputs 4kV .. 4kV + 4V - 1, in order).
 *   After a block's 8 groups the int32 sums are read out (`mova {z8.d-z11.d}, za.d[w11, k, vgx4]`), ZA is
 *   zeroed, and per vector: `scvtf` (exact), `fcvt` of the record's binary16 scales (ld1h into 32-bit
 *   lanes; exact), `fmul` t = xd[b] * dw (xd first), `fmla` acc += s * t (fused) into the tile's 64/V
 *   fp32 accumulators z16 .. z16 + 64/V - 1.
 *   q4_0: the unsigned nibbles (`and #0x0f`: group g, `lsr #4`: group g + 4, g < 4) are dotted and the
 *   sums corrected by -8 sum(xq of the block) (`saddv` over the 32 bytes, exact) before the conversion.
 *
 * Streaming mode: smstart / smstop inside the call (ZA dead on entry and exit, no lazy save); d8-d15,
 * which they zero, are saved on the stack.  Only instructions legal in streaming mode without
 * FEAT_SME_FA64 (SVE contiguous and load-replicate loads, SME2 multi-vector loads / stores / sdot / mova,
 * SVE integer and fp arithmetic); no Advanced SIMD.  SVL 128, 256, 512 bits; a larger one executes
 * `brk #0x5e2` (Python uses the neon family there).
 *
 * Registers (streaming):
 *     x0 w   x1 xq   x2 xd   x3 b (+64 tile_begin) or 0   x4 y (+64 tile_begin)   x5 n_in   x6 tile_begin
 *     x7 tiles left   x9 scale cursor   x10 SVL_B   w11 0 (ZA vector select)   x12 record   x13 nb
 *     x14 xq cursor   x15 xd cursor   x16 blocks left   x17 group cursor
 *     z0-z3 weights   z4, z5 xq replicated   z6 xd[b]   z7 q4: -8 sum(xq)   z8-z11 sums read out
 *     z12-z15 q4: high nibbles; dw, t   z16 .. the fp32 accumulators (outputs jV .. jV+V-1 in z16+j)
 *     p0 all .s   p1 all .b   p2 the first 16 bytes   pn8 all .b   pn9 all .s
 */
#include "asm.S"

        .arch_extension sme2

#define REC_Q8 2176
#define REC_Q4 1152

        /* group g of the current record (x17), all NC chunks: q8_0 */
        .macro  g_q8 nc, xr, lane
        .irp    k, 0, 1, 2, 3
        .if \k < \nc
        ld1b    {z0.b - z3.b}, pn8/z, [x17, #4 * \k, mul vl]
        sdot    za.s[w11, \k, vgx4], {z0.b - z3.b}, z\xr\().b[\lane]
        .endif
        .endr
        add     x17, x17, #256
        .endm

        /* q4_0: packed group g < 4 (low nibbles: group g, high: group g + 4) */
        .macro  g_q4 nc, lane
        .irp    k, 0, 1, 2, 3
        .if \k < \nc
        ld1b    {z0.b - z3.b}, pn8/z, [x17, #4 * \k, mul vl]
        lsr     z12.b, z0.b, #4
        lsr     z13.b, z1.b, #4
        lsr     z14.b, z2.b, #4
        lsr     z15.b, z3.b, #4
        and     z0.b, z0.b, #0x0f
        and     z1.b, z1.b, #0x0f
        and     z2.b, z2.b, #0x0f
        and     z3.b, z3.b, #0x0f
        sdot    za.s[w11, \k, vgx4], {z0.b - z3.b}, z4.b[\lane]
        sdot    za.s[w11, \k, vgx4], {z12.b - z15.b}, z5.b[\lane]
        .endif
        .endr
        add     x17, x17, #256
        .endm

        /* chunk k's 4 vectors of sums -> acc z\a0 .. z\a3 += s * (xd * dw); scales at x9 (advanced) */
        .macro  epi kind, k, a0, a1, a2, a3
        mova    {z8.d - z11.d}, za.d[w11, \k, vgx4]
        ld1h    {z12.s}, p0/z, [x9]                     // dw, one binary16 in each 32-bit lane
        ld1h    {z13.s}, p0/z, [x9, #1, mul vl]
        ld1h    {z14.s}, p0/z, [x9, #2, mul vl]
        ld1h    {z15.s}, p0/z, [x9, #3, mul vl]
        addvl   x9, x9, #2                              // 4V halves
        .ifc \kind, q4_0
        add     z8.s, z8.s, z7.s                        // s = sum u x - 8 sum x
        add     z9.s, z9.s, z7.s
        add     z10.s, z10.s, z7.s
        add     z11.s, z11.s, z7.s
        .endif
        fcvt    z12.s, p0/m, z12.h                      // exact widening
        fcvt    z13.s, p0/m, z13.h
        fcvt    z14.s, p0/m, z14.h
        fcvt    z15.s, p0/m, z15.h
        scvtf   z8.s, p0/m, z8.s                        // exact (|s| < 2^24)
        scvtf   z9.s, p0/m, z9.s
        scvtf   z10.s, p0/m, z10.s
        scvtf   z11.s, p0/m, z11.s
        fmul    z12.s, z6.s, z12.s                      // t = xd[b] * dw
        fmul    z13.s, z6.s, z13.s
        fmul    z14.s, z6.s, z14.s
        fmul    z15.s, z6.s, z15.s
        fmla    z\a0\().s, p0/m, z8.s, z12.s            // acc = fma(s, t, acc)
        fmla    z\a1\().s, p0/m, z9.s, z13.s
        fmla    z\a2\().s, p0/m, z10.s, z14.s
        fmla    z\a3\().s, p0/m, z11.s, z15.s
        .endm

        /* y (x4, 4 vectors from z\a0) = acc + b (x3, if non-zero), chunk k */
        .macro  out k, a0, a1, a2, a3
        cbz     x3, 1f
        ld1w    {z8.s - z11.s}, pn9/z, [x3, #4 * \k, mul vl]
        fadd    z\a0\().s, z\a0\().s, z8.s
        fadd    z\a1\().s, z\a1\().s, z9.s
        fadd    z\a2\().s, z\a2\().s, z10.s
        fadd    z\a3\().s, z\a3\().s, z11.s
1:
        st1w    {z\a0\().s - z\a3\().s}, pn9, [x4, #4 * \k, mul vl]
        .endm

        /* every tile of the range at one SVL (nc chunks a group) */
        .macro  tiles kind, nc, rec
2:                                                      // for each tile
        mov     z16.s, #0                                // acc = +0.0 (all 16: 64/V of them used)
        mov     z17.s, #0
        mov     z18.s, #0
        mov     z19.s, #0
        mov     z20.s, #0
        mov     z21.s, #0
        mov     z22.s, #0
        mov     z23.s, #0
        mov     z24.s, #0
        mov     z25.s, #0
        mov     z26.s, #0
        mov     z27.s, #0
        mov     z28.s, #0
        mov     z29.s, #0
        mov     z30.s, #0
        mov     z31.s, #0
        mov     x14, x1
        mov     x15, x2
        mov     x16, x13
3:                                                      // for each block, in input order
        ld1rqb  {z4.b}, p1/z, [x14]                     // xq[0 .. 15] in every 128-bit segment
        ld1rqb  {z5.b}, p1/z, [x14, #16]                // xq[16 .. 31]
        add     x14, x14, #32
        ld1rw   {z6.s}, p0/z, [x15]                     // xd[b]
        add     x15, x15, #4
        add     x17, x12, #128                          // group 0
        .ifc \kind, q8_0
        g_q8    \nc, 4, 0
        g_q8    \nc, 4, 1
        g_q8    \nc, 4, 2
        g_q8    \nc, 4, 3
        g_q8    \nc, 5, 0
        g_q8    \nc, 5, 1
        g_q8    \nc, 5, 2
        g_q8    \nc, 5, 3
        .else
        saddv   d12, p2, z4.b                           // sum(xq), exact
        saddv   d13, p2, z5.b
        add     z12.d, z12.d, z13.d
        mov     z7.s, z12.s[0]
        lsl     z7.s, z7.s, #3
        neg     z7.s, p0/m, z7.s                        // -8 sum(xq)
        g_q4    \nc, 0
        g_q4    \nc, 1
        g_q4    \nc, 2
        g_q4    \nc, 3
        .endif
        mov     x9, x12                                 // the 64 scales
        epi     \kind, 0, 16, 17, 18, 19
        .if \nc > 1
        epi     \kind, 1, 20, 21, 22, 23
        .endif
        .if \nc > 2
        epi     \kind, 2, 24, 25, 26, 27
        epi     \kind, 3, 28, 29, 30, 31
        .endif
        zero    {za}
        add     x12, x12, #\rec
        subs    x16, x16, #1
        b.ne    3b
        out     0, 16, 17, 18, 19
        .if \nc > 1
        out     1, 20, 21, 22, 23
        .endif
        .if \nc > 2
        out     2, 24, 25, 26, 27
        out     3, 28, 29, 30, 31
        .endif
        add     x4, x4, #256
        cbz     x3, 4f
        add     x3, x3, #256
4:
        subs    x7, x7, #1
        b.ne    2b
        .endm

        .macro  matvec_q0_sme2 kind, rec
function gpt2asm_matvec_\kind\()_sme2, export=1
        subs    x7, x7, x6                              // tiles
        b.ls    99f
        lsr     x13, x5, #5                             // nb
        cbz     x13, 99f
        sub     sp, sp, #64                             // smstart / smstop zero v8-v15
        callee_d8_d15 stp, 0
        lsl     x9, x6, #8                              // 64 floats = 256 bytes per tile
        add     x4, x4, x9
        cbz     x3, 1f
        add     x3, x3, x9
1:
        mul     x9, x6, x13
        mov     x10, #\rec
        madd    x12, x9, x10, x0                        // the first record of tile tile_begin
        rdsvl   x10, #1                                 // SVL in bytes (legal outside streaming mode)
        smstart
        ptrue   p0.s
        ptrue   p1.b
        mov     x9, #16
        whilelo p2.b, xzr, x9                           // the first 16 bytes
        ptrue   pn8.b
        ptrue   pn9.s
        mov     w11, #0
        zero    {za}
        cmp     x10, #64
        b.eq    5f
        cmp     x10, #32
        b.eq    6f
        cmp     x10, #16
        b.eq    7f
        smstop
        brk     #0x5e2                                  // SVL > 512 bits: not supported (Python uses NEON)
5:
        tiles   \kind, 1, \rec
        b       8f
6:
        tiles   \kind, 2, \rec
        b       8f
7:
        tiles   \kind, 4, \rec
8:
        smstop
        callee_d8_d15 ldp, 0
        add     sp, sp, #64
99:
        ret
endfunc
        .endm

/*
 * void gpt2asm_matvec_q8_0_sme2(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
 *                               float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 * void gpt2asm_matvec_q4_0_sme2(the same);
 *   as gpt2asm_matvec_<kind>_neon (docs/kernels.md "q8_0 / q4_0"): reads only the records of tiles
 *   tile_begin .. tile_end-1, xq[0 .. n_in), xd[0 .. nb), b[64 tile_begin .. 64 tile_end) if b != NULL;
 *   writes y[64 tile_begin .. 64 tile_end) only.
 */
        matvec_q0_sme2 q8_0, REC_Q8
        matvec_q0_sme2 q4_0, REC_Q4
