/*
 * asm/aarch64/matvec_sme2.S -- tiled matrix-vector product with SME2: tile sums in the ZA array.
 *
 *   void gpt2asm_matvec_f32_sme2(const float *w, const float *x, const float *b, float *y,
 *                                size_t n_in, size_t tile_begin, size_t tile_end);
 *   void gpt2asm_matvec_f16_sme2(const uint16_t *w, const float *x, const float *b, float *y,
 *                                size_t n_in, size_t tile_begin, size_t tile_end);
 *
 * Same ABI and the same per-output operation sequence as gpt2asm_matvec_{f32,f16}_{avx2,avx512}
 * (docs/kernels.md): for every output o = 64t + j of the tiles tile_begin <= t < tile_end
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc);   y[o] = acc (+ b[o])
 * with w tiled [n_tiles][n_in][64] (fp32, or binary16 widened exactly to fp32 before the FMA), so the
 * outputs are bit-identical to the x86 kernels (NaN payloads aside).
 *
 * Each function enters streaming mode with ZA enabled (smstart) and leaves it (smstop) before returning:
 * callers see an ordinary AAPCS64 function.  smstart/smstop zero the Z and P registers, and with them
 * the callee-saved d8-d15, so those are saved on the stack around the streaming section.  ZA is dead on
 * entry and exit (the caller holds no ZA state: no lazy-save protocol, TPIDR2_EL0 is not looked at).
 * Only instructions legal in streaming mode without FEAT_SME_FA64 are executed while streaming (SVE2
 * contiguous and load-replicate loads, SVE2 fcvt/fcvtlt, SME2 multi-vector loads/stores, ZA FMLA,
 * FADD and MOVA): no Advanced SIMD, no gathers, no first-fault loads.  No FEAT_SME2p1 or
 * FEAT_SME_F16F16 instruction is used.
 *
 * How the sums are kept (SVL = the streaming vector length, SVL_B bytes; V = SVL_B/4 floats a vector):
 *   `fmla za.s[w8, c, vgx4], {z16.s-z19.s}, z0.s[r]` adds z16..z19 times x[i] (element r of each
 *   128-bit segment of z0, which holds x[i-r .. i-r+3] replicated by ld1rqw) into the ZA array vectors
 *   c, c + SVL_B/4, c + 2 SVL_B/4, c + 3 SVL_B/4 -- "slot" c.  Every FMLA is fused (one rounding) and
 *   adds into each sum in input order, exactly the contract's fma chain.  A tile row (64 weights) is
 *   256/SVL_B vectors, so a row of one tile fills 64/(4V) slots; each pass over the weights keeps
 *   4 slots = 16 ZA vectors busy (4 independent accumulation chains, 16 Z registers of weights per row):
 *
 *       SVL   V   vectors/row  slots/tile  tiles a pass  slot c holds                     ZA used
 *       512  16        4           1            4        tile c, outputs 0..63            16 of 64
 *       256   8        8           2            2        tile c/2, outputs 32(c%2)..+31   16 of 32
 *       128   4       16           4            1        outputs 16c .. 16c+15            16 of 16
 *
 *   fp32: slot c's four ZA vectors hold 4V consecutive outputs in order.  fp16: a pair of binary16
 *   vectors (2 x 2V halves, one `ld1h` of two registers) is widened exactly by SVE2 `fcvt` (even
 *   halves) and `fcvtlt` (odd halves) into {even of first, odd of first, even of second, odd of
 *   second}, so slot c holds its 4V outputs de-interleaved; the bias is read with `ld2w` and the result
 *   written with `st2w`, which undo that permutation (the arithmetic per output is unchanged).
 *   At SVL 512 the last 1-3 tiles of the range go through a pass of 2 and/or a pass of 1 tile, at
 *   256 an odd last tile through a pass of 1.  Several tiles a pass means several forward streams
 *   (one per tile); each tile is read exactly once, rows in order, with 4-register (256-byte at SVL
 *   512) multi-vector loads.
 *   After the rows: b is added in ZA (SME2 multi-vector `fadd za.s[...]`, acc + b, one rounding),
 *   the slot is read out with `mova` and stored.  ZA is zeroed (+0.0) at the start of every pass.
 *
 * Streaming vector lengths 128, 256 and 512 bits are supported (RDSVL, one code path each); a larger one
 * is not (the Python side uses NEON there) and executes `brk #0x5e2` rather than compute anything wrong.
 * Reads exactly the tiles tile_begin .. tile_end-1 of w, x[0 .. n_in-1] (the last n_in % 4 through a
 * predicated ld1rqw), b[64 tile_begin .. 64 tile_end) when b != NULL; writes exactly
 * y[64 tile_begin .. 64 tile_end).  Requires n_in >= 1, tile_begin <= tile_end (equal: no access, no
 * streaming mode).  Alignment: none required (w is 64-byte aligned in practice).
 *
 * Registers (streaming section):
 *     x0  w at the current pass        x1  x                      x2  b (+64*tile) or 0
 *     x3  y (+64*tile)                 x4  n_in                   x5  tiles left (counts down)
 *     x6  bytes per tile               x7  n_in / 4               w8  ZA slice base, 0
 *     x9  n_in % 4 (tail rows)         x10-x13  the pass's tile row pointers
 *     x14 x cursor                     x15 row-block counter
 *     z0  x[i..i+3] replicated         z4-z11 binary16 weights    z16-z31 fp32 weights (4 slots)
 *     z24-z27 bias (read-out only)     z4-z7 read-out             p0 all-true .s, p1 tail, pn8 / pn9
 *     all-true counters for .s / .h
 */
#include "asm.S"

        .arch_extension sme2

/* ---------------------------------------------------------------------------------------------- */
/* one slot's registers                                                                            */

        /* fp32 weights of slot \c: 4 vectors at [\p, #\off, mul vl] */
        .macro  ld_w32  c, p, off
        .if \c == 0
        ld1w    {z16.s-z19.s}, pn8/z, [\p, #\off, mul vl]
        .elseif \c == 1
        ld1w    {z20.s-z23.s}, pn8/z, [\p, #\off, mul vl]
        .elseif \c == 2
        ld1w    {z24.s-z27.s}, pn8/z, [\p, #\off, mul vl]
        .else
        ld1w    {z28.s-z31.s}, pn8/z, [\p, #\off, mul vl]
        .endif
        .endm

        /* binary16 weights of slot \c: 2 vectors (4V halves) at [\p, #\off, mul vl] */
        .macro  ld_w16  c, p, off
        .if \c == 0
        ld1h    {z4.h-z5.h}, pn9/z, [\p, #\off, mul vl]
        .elseif \c == 1
        ld1h    {z6.h-z7.h}, pn9/z, [\p, #\off, mul vl]
        .elseif \c == 2
        ld1h    {z8.h-z9.h}, pn9/z, [\p, #\off, mul vl]
        .else
        ld1h    {z10.h-z11.h}, pn9/z, [\p, #\off, mul vl]
        .endif
        .endm

        /* widen slot \c's halves exactly: {zA.h, zB.h} -> {even A, odd A, even B, odd B} as fp32 */
        .macro  cvt2    a, b, d0, d1, d2, d3
        fcvt    \d0\().s, p0/m, \a\().h
        fcvtlt  \d1\().s, p0/m, \a\().h
        fcvt    \d2\().s, p0/m, \b\().h
        fcvtlt  \d3\().s, p0/m, \b\().h
        .endm
        .macro  cvt     c
        .if \c == 0
        cvt2    z4, z5, z16, z17, z18, z19
        .elseif \c == 1
        cvt2    z6, z7, z20, z21, z22, z23
        .elseif \c == 2
        cvt2    z8, z9, z24, z25, z26, z27
        .else
        cvt2    z10, z11, z28, z29, z30, z31
        .endif
        .endm

        /* slot \c += its 4 weight vectors * x[i], x[i] = element \r of each 128-bit segment of z0 */
        .macro  fma     c, r
        .if \c == 0
        fmla    za.s[w8, 0, vgx4], {z16.s-z19.s}, z0.s[\r]
        .elseif \c == 1
        fmla    za.s[w8, 1, vgx4], {z20.s-z23.s}, z0.s[\r]
        .elseif \c == 2
        fmla    za.s[w8, 2, vgx4], {z24.s-z27.s}, z0.s[\r]
        .else
        fmla    za.s[w8, 3, vgx4], {z28.s-z31.s}, z0.s[\r]
        .endif
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* one weight row (input i, x[i] = z0.s[\r]) of the \g tiles of a pass                             */

        /* \svl: SVL in bytes (64, 32, 16); \g tiles in the pass; \r: row within the block of 4, and
         * the row's offset from the tile pointers at SVL 512/256 (which advance once per block); at
         * SVL 128 (one tile, 16 vectors a row) the pointer advances every row. */
        .macro  row32   svl, g, r
        .if \svl == 64                          // 4 vectors a row: slot c = tile c
        ld_w32  0, x10, 4*\r
        .if \g > 1
        ld_w32  1, x11, 4*\r
        .endif
        .if \g > 2
        ld_w32  2, x12, 4*\r
        ld_w32  3, x13, 4*\r
        .endif
        fma     0, \r
        .if \g > 1
        fma     1, \r
        .endif
        .if \g > 2
        fma     2, \r
        fma     3, \r
        .endif
        .elseif \svl == 32                      // 8 vectors a row: slots 2k, 2k+1 = tile k
        ld_w32  0, x10, 8*\r
        ld_w32  1, x10, 8*\r+4
        .if \g > 1
        ld_w32  2, x11, 8*\r
        ld_w32  3, x11, 8*\r+4
        .endif
        fma     0, \r
        fma     1, \r
        .if \g > 1
        fma     2, \r
        fma     3, \r
        .endif
        .else                                   // 16 vectors a row: slots 0-3 = the one tile
        ld_w32  0, x10, 0
        ld_w32  1, x10, 4
        ld_w32  2, x10, 8
        ld_w32  3, x10, 12
        add     x10, x10, #256
        fma     0, \r
        fma     1, \r
        fma     2, \r
        fma     3, \r
        .endif
        .endm

        /* the same for binary16 rows (half the bytes: 2, 4, 8 vectors a row), widened before the FMA */
        .macro  row16   svl, g, r
        .if \svl == 64
        ld_w16  0, x10, 2*\r
        .if \g > 1
        ld_w16  1, x11, 2*\r
        .endif
        .if \g > 2
        ld_w16  2, x12, 2*\r
        ld_w16  3, x13, 2*\r
        .endif
        cvt     0
        fma     0, \r
        .if \g > 1
        cvt     1
        fma     1, \r
        .endif
        .if \g > 2
        cvt     2
        fma     2, \r
        cvt     3
        fma     3, \r
        .endif
        .elseif \svl == 32
        ld_w16  0, x10, 4*\r
        ld_w16  1, x10, 4*\r+2
        .if \g > 1
        ld_w16  2, x11, 4*\r
        ld_w16  3, x11, 4*\r+2
        .endif
        cvt     0
        fma     0, \r
        cvt     1
        fma     1, \r
        .if \g > 1
        cvt     2
        fma     2, \r
        cvt     3
        fma     3, \r
        .endif
        .else
        ld_w16  0, x10, 0
        ld_w16  1, x10, 2
        ld_w16  2, x10, 4
        ld_w16  3, x10, 6
        add     x10, x10, #128
        cvt     0
        fma     0, \r
        cvt     1
        fma     1, \r
        cvt     2
        fma     2, \r
        cvt     3
        fma     3, \r
        .endif
        .endm

        .macro  row     dt, svl, g, r
        .if \dt == 32
        row32   \svl, \g, \r
        .else
        row16   \svl, \g, \r
        .endif
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* read-out: y = slot (+ b), one tile                                                              */

        /* slot \c holds the 4V outputs starting at vector \h*4 of the tile (fp32 vectors) */
        .macro  bias_slot dt, c, h
        .if \dt == 32
        ld1w    {z24.s-z27.s}, pn8/z, [x2, #4*\h, mul vl]
        .else
        ld2w    {z24.s, z25.s}, p0/z, [x2, #4*\h, mul vl]     // even / odd outputs of the first 2V
        ld2w    {z26.s, z27.s}, p0/z, [x2, #4*\h+2, mul vl]   // ... of the second 2V
        .endif
        fadd    za.s[w8, \c, vgx4], {z24.s-z27.s}           // acc + b, one rounding each
        .endm

        .macro  store_slot dt, c, h
        mova    {z4.d-z7.d}, za.d[w8, \c, vgx4]
        .if \dt == 32
        st1w    {z4.s-z7.s}, pn8, [x3, #4*\h, mul vl]
        .else
        st2w    {z4.s, z5.s}, p0, [x3, #4*\h, mul vl]         // re-interleave even / odd
        st2w    {z6.s, z7.s}, p0, [x3, #4*\h+2, mul vl]
        .endif
        .endm

        /* tile \k of the pass: its slots (SVL 512: k; 256: 2k, 2k+1; 128: 0-3); b, y advance 256 B */
        .macro  store_tile dt, svl, k
        cbz     x2, 4f
        .if \svl == 64
        bias_slot \dt, \k, 0
        .elseif \svl == 32
        bias_slot \dt, 2*\k, 0
        bias_slot \dt, 2*\k+1, 1
        .else
        bias_slot \dt, 0, 0
        bias_slot \dt, 1, 1
        bias_slot \dt, 2, 2
        bias_slot \dt, 3, 3
        .endif
        add     x2, x2, #256
4:
        .if \svl == 64
        store_slot \dt, \k, 0
        .elseif \svl == 32
        store_slot \dt, 2*\k, 0
        store_slot \dt, 2*\k+1, 1
        .else
        store_slot \dt, 0, 0
        store_slot \dt, 1, 1
        store_slot \dt, 2, 2
        store_slot \dt, 3, 3
        .endif
        add     x3, x3, #256
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* one pass: \g consecutive tiles (1, 2 or 4) starting at x0, all rows, then their outputs          */

        .macro  pass    dt, svl, g
        zero    {za}                            // every sum starts at +0.0
        mov     x10, x0
        .if \g > 1
        add     x11, x10, x6
        .endif
        .if \g > 2
        add     x12, x11, x6
        add     x13, x12, x6
        .endif
        mov     x14, x1                         // x cursor
        mov     x15, x7                         // n_in / 4 blocks
        cbz     x15, 2f
        .p2align 4
1:                                              // 4 rows, in input order
        ld1rqw  {z0.s}, p0/z, [x14]             // x[i .. i+3] in every 128-bit segment
        add     x14, x14, #16
        row     \dt, \svl, \g, 0
        row     \dt, \svl, \g, 1
        row     \dt, \svl, \g, 2
        row     \dt, \svl, \g, 3
        .if \svl != 16                          // SVL 128 advanced x10 row by row
        add     x10, x10, #(\dt*32)             // 4 rows: 1024 bytes fp32, 512 fp16
        .if \g > 1
        add     x11, x11, #(\dt*32)
        .endif
        .if \g > 2
        add     x12, x12, #(\dt*32)
        add     x13, x13, #(\dt*32)
        .endif
        .endif
        subs    x15, x15, #1
        b.ne    1b
2:
        cbz     x9, 3f                          // n_in % 4 rows left: 1, 2 or 3
        whilelo p1.s, xzr, x9
        ld1rqw  {z0.s}, p1/z, [x14]             // only x[i .. n_in-1] is read
        row     \dt, \svl, \g, 0
        cmp     x9, #2
        b.lo    3f
        row     \dt, \svl, \g, 1
        b.eq    3f
        row     \dt, \svl, \g, 2
3:
        .if \g == 1
        add     x0, x0, x6                      // next pass: \g tiles further
        .elseif \g == 2
        add     x0, x0, x6, lsl #1
        .else
        add     x0, x0, x6, lsl #2
        .endif
        store_tile \dt, \svl, 0
        .if \g > 1
        store_tile \dt, \svl, 1
        .endif
        .if \g > 2
        store_tile \dt, \svl, 2
        store_tile \dt, \svl, 3
        .endif
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* the whole function for one weight type (\dt = 32 or 16 bits a weight)                           */

        .macro  matvec_sme2 dt
        subs    x5, x6, x5                      // tiles in the range
        b.ls    9f                              // tile_end <= tile_begin: nothing to do
        sub     x6, x6, x5                      // tile_begin
        lsl     x9, x6, #8                      // 64 floats = 256 bytes of b / y per tile
        add     x3, x3, x9                      // y += 64 * tile_begin
        cbz     x2, 1f
        add     x2, x2, x9                      // b += 64 * tile_begin (only if non-NULL)
1:
        .if \dt == 32
        lsl     x9, x4, #8                      // bytes per tile: n_in rows of 256
        .else
        lsl     x9, x4, #7                      // ... or of 128
        .endif
        madd    x0, x6, x9, x0                  // w += tile_begin * tile bytes
        mov     x6, x9
        lsr     x7, x4, #2
        sub     sp, sp, #64                     // smstart/smstop zero v8-v15
        callee_d8_d15 stp, 0
        rdsvl   x10, #1                         // SVL in bytes (legal outside streaming mode)
        smstart                                 // streaming mode + ZA (Z, P and ZA now zero)
        ptrue   p0.s
        ptrue   pn8.s                           // all-true counters: their element size must be the
        ptrue   pn9.h                           // load's (a .s counter governs every other half)
        mov     w8, #0
        and     x9, x4, #3                      // tail rows
        cmp     x10, #64
        b.eq    5f
        cmp     x10, #32
        b.eq    6f
        cmp     x10, #16
        b.eq    7f
        smstop
        brk     #0x5e2                          // SVL > 512 bits: not supported (Python uses NEON)

5:                                              // ---- SVL 512: passes of 4 tiles, then 2, then 1
        subs    x5, x5, #4
        b.lo    52f
51:
        pass    \dt, 64, 4
        subs    x5, x5, #4
        b.hs    51b
52:                                             // x5 = left - 4 (mod 4 the same as left)
        tbz     x5, #1, 53f
        pass    \dt, 64, 2
53:
        tbz     x5, #0, 8f
        pass    \dt, 64, 1
        b       8f

6:                                              // ---- SVL 256: passes of 2 tiles, then 1
        subs    x5, x5, #2
        b.lo    62f
61:
        pass    \dt, 32, 2
        subs    x5, x5, #2
        b.hs    61b
62:
        tbz     x5, #0, 8f
        pass    \dt, 32, 1
        b       8f

7:                                              // ---- SVL 128: one tile a pass
71:
        pass    \dt, 16, 1
        subs    x5, x5, #1
        b.ne    71b

8:
        smstop                                  // back to non-streaming, ZA off
        callee_d8_d15 ldp, 0
        add     sp, sp, #64
9:
        ret
        .endm

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_matvec_f32_sme2(const float *w, const float *x, const float *b, float *y,
 *                              size_t n_in, size_t tile_begin, size_t tile_end);
 */
function gpt2asm_matvec_f32_sme2, export=1
        matvec_sme2 32
endfunc

/*
 * void gpt2asm_matvec_f16_sme2(const uint16_t *w, const float *x, const float *b, float *y,
 *                              size_t n_in, size_t tile_begin, size_t tile_end);
 *   w[t][i][j] binary16, widened exactly (fcvt / fcvtlt) before the FMA.
 */
function gpt2asm_matvec_f16_sme2, export=1
        matvec_sme2 16
endfunc
