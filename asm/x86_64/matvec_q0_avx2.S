/*
 * asm/x86_64/matvec_q0_avx2.S -- q8_0 / q4_0 decode (matrix-vector) kernels, AVX2 and AVX-VNNI (ymm).
 *
 * docs/kernels.md "q8_0 / q4_0" (layouts, the per-output sequence; numpy model tests/q0ref.py, matvec).  The weights
 * stream once, record after record (tile t, block b: 64 fp16 scales, then the ints); the activations
 * come quantized (xq int8, xd fp32 per block of 32).  A record is taken front to back, group after group,
 * each group's 8 vectors (32 bytes = 8 outputs x 4 inputs each) into the record's 8 int32 block sums
 * ymm4-11 (vector k: outputs 8k .. 8k+7): in one pass, so the weights stream strictly in address order
 * (taking a record in two halves of 32 outputs, every other 128 bytes, then the rest, ran at 0.58-0.79
 * of a plain read with the weights in DRAM; in order 0.90-0.92: docs/notes.md).  The fp32 sums of
 * outputs 0-31 live in ymm12-15, those of outputs 32-63 in a 128-byte stack slot (r12, spilled: 16
 * registers hold 8 int sums, X, a constant, two temporaries and only 4 fp32 sums).  Then per record, in
 * this order per output o:
 *     s   = exact int32 block sum                      (ymm4-11)
 *     t   = xd[b] * dw[o][b]                           vbroadcastss xd[b]; vcvtph2ps dw; vmulps (xd first)
 *     acc = fma((float)s, t, acc)                      vcvtdq2ps s; vfmadd231ps t, s, acc (outputs
 *                                                      32-63: acc loaded from and stored back to r12)
 * and at the end of the tile y = acc + b (vaddps) or acc.  The integer sums, per group g (4 inputs,
 * xq[32b+4g .. +3] broadcast as one dword X to every lane; one lane = one output's 4 inputs):
 *   q8_0 avx2     (sign trick) p = vpmaddubsw(|w|, X * sign(w)) (vpabsb, vpsignb: |w| <= 128 unsigned,
 *                 |X| <= 127 signed, pair sums <= 32512: no saturation); s += vpmaddwd(p, 1)
 *   q8_0 avxvnni  s += vpdpbusd(w ^ 0x80, X) = sum (w + 128) * x; s starts at -128 * sum(xq of block)
 *   q4_0 avx2     the nibbles u = w + 8 (0..15) unsigned as they are: p16 += vpmaddubsw(u_lo, X_g)
 *                 + vpmaddubsw(u_hi, X_g+4) in int16 over the 4 byte-groups (|p16| <= 8*2*15*128 < 2^15),
 *                 then s = vpmaddwd(p16, 1) - 8 * sum(xq of block)
 *   q4_0 avxvnni  s += vpdpbusd(u_lo, X_g) + vpdpbusd(u_hi, X_g+4); s starts at -8 * sum(xq of block)
 * All exact, so every variant gives the contract's bits.  Per 64 weight bytes: q8_0 avx2 10 vector ops
 * (+4 loads), avxvnni 4; q4_0 (128 weights) avx2 14, avxvnni 10; per record 8 more (the spilled sums'
 * loads and stores).  Measured with python tests/test_kernels_q0.py --bench (GB/s of weights streamed
 * against a plain read): docs/notes.md.
 *
 * Registers: see matvec_q0.h; ymm0 X (then xd[b]), ymm1 1 (int16) / 0x80 bytes / X_g+4, ymm2-3 temps,
 * ymm4-11 the record's int32 (q4_0 avx2: int16) sums, ymm12-15 the fp32 sums of outputs 0-31, r12 those
 * of outputs 32-63 (memory); rbx the constants.
 */
#include "asm.S"
#include "q0_const.h"
/* The AVX-VNNI kernels prefetch (prefetcht0) every line of the record Q0_PFD_Q8 / Q0_PFD_Q4 bytes ahead: on
 * Zen 5 (the first AMD core with AVX-VNNI) their weight stream ran at ~0.75 of a plain read without it
 * (nops, spilling fewer sums: no better), 0.89 (q8_0) / 0.88 (q4_0) with it (docs/notes.md "q0 decode,
 * ymm, on Zen 5").  Hints: they never fault and change nothing; past the matrix they run on harmlessly. */
#ifndef Q0_PFD_Q8
#  define Q0_PFD_Q8 4096
#endif
#ifndef Q0_PFD_Q4
#  define Q0_PFD_Q4 5120
#endif
        /* prefetch the record header's 2 lines (\d bytes ahead of rdi) / group g's 4 lines */
        .macro  pf_head d
        prefetcht0 \d(%rdi)
        prefetcht0 \d+64(%rdi)
        .endm
        .macro  pf_group d, g
        prefetcht0 \d+128+256*\g(%rdi)
        prefetcht0 \d+192+256*\g(%rdi)
        prefetcht0 \d+256+256*\g(%rdi)
        prefetcht0 \d+320+256*\g(%rdi)
        .endm

        q0_const q0_mv_avx2, 32
        .set    Q0_SPILL, 128                   // the fp32 sums of outputs 32-63 (r12)

        .macro  q0_consts
        movrel  %rbx, q0_mv_avx2
        .endm

        .macro  q0_zero
        vzero   2, 12, 13, 14, 15
        vstore  %r12, 0, 32, ymm, 2,2,2,2
        .endm

        .macro  q0_exit
        vzeroupper
        ret
        .endm

        .macro  q0_store
        vmovaps 0(%r12), %ymm4                  // the sums of outputs 32-63
        vmovaps 32(%r12), %ymm5
        vmovaps 64(%r12), %ymm6
        vmovaps 96(%r12), %ymm7
        testq   %rcx, %rcx
        jz      1f
        vmemop  vaddps, %rcx, 0, 32, ymm, 12,13,14,15,4,5,6,7  // y = acc + b
1:
        vstore  %r8, 0, 32, ymm, 12,13,14,15,4,5,6,7
        .endm

#include "matvec_q0.h"

        /* acc[f] = fma((float)s[i], xd[b] * dw[8 outputs at record byte \off], acc[f]); ymm0 = xd[b] */
        .macro  flt1 off, i, f
        vcvtph2ps \off(%rdi), %ymm2
        vmulps  %ymm2, %ymm0, %ymm2             // t = xd[b] * dw
        vcvtdq2ps %ymm\i, %ymm3
        vfmadd231ps %ymm2, %ymm3, %ymm\f        // acc = fma(s, t, acc)
        .endm

        /* the same for a spilled acc at \m(%r12) */
        .macro  flt1m off, i, m
        vcvtph2ps \off(%rdi), %ymm2
        vmulps  %ymm2, %ymm0, %ymm2             // t = xd[b] * dw
        vcvtdq2ps %ymm\i, %ymm\i
        vmovaps \m(%r12), %ymm3
        vfmadd231ps %ymm2, %ymm\i, %ymm3        // acc = fma(s, t, acc)
        vmovaps %ymm3, \m(%r12)
        .endm

        .macro  flt_rec
        vbroadcastss (%rdx,%r11,4), %ymm0
        flt1    0, 4, 12
        flt1    16, 5, 13
        flt1    32, 6, 14
        flt1    48, 7, 15
        flt1m   64, 8, 0
        flt1m   80, 9, 32
        flt1m   96, 10, 64
        flt1m   112, 11, 96
        .endm

        /* \mac OFF, S(, \a) on the 8 vectors (OFF = 128 + 256g + 32k, sums S = ymm4+k) of group g */
        .macro  each_vec mac, g, a
        each_off \mac, 128+256*\g, 32, \a, 4, 5, 6, 7, 8, 9, 10, 11
        .endm

        /* s[i] (+)= sum over 4 inputs of w * X, sign trick; ymm1 = int16 ones */
        .macro  q8s_vec off, i, g
        vpabsb  \off(%rdi), %ymm2               // |w| (128 for -128: unsigned)
        vpsignb \off(%rdi), %ymm0, %ymm3        // X * sign(w)
        vpmaddubsw %ymm3, %ymm2, %ymm2          // |w| * X * sign(w), pairs summed: int16, exact
        .if \g == 0
        vpmaddwd %ymm1, %ymm2, %ymm\i
        .else
        vpmaddwd %ymm1, %ymm2, %ymm2
        vpaddd  %ymm2, %ymm\i, %ymm\i
        .endif
        .endm

        .macro  q8_avx2_blk
        vmovdqa Q0_ONES(%rbx), %ymm1
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vpbroadcastd 4*\g(%rax), %ymm0
        each_vec q8s_vec, \g, \g
        .endr
        flt_rec
        .endm

        /* s[i] += vpdpbusd(w ^ 0x80, X); ymm1 = 0x80 bytes */
        .macro  q8v_vec off, i
        vpxor   \off(%rdi), %ymm1, %ymm2        // w + 128, unsigned
        {vex} vpdpbusd %ymm0, %ymm2, %ymm\i
        .endm

        .macro  init_corr
        vpbroadcastd (%rsp,%r11,4), %ymm4       // s = -c * sum(xq of the block)
        .irp    i, 5, 6, 7, 8, 9, 10, 11
        vmovdqa %ymm4, %ymm\i
        .endr
        .endm

        .macro  q8_avxvnni_blk
        vmovdqa Q0_K80(%rbx), %ymm1
        init_corr
        pf_head Q0_PFD_Q8
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vpbroadcastd 4*\g(%rax), %ymm0
        pf_group Q0_PFD_Q8, \g
        each_vec q8v_vec, \g
        .endr
        flt_rec
        .endm

        /* the low and high nibbles of 32 bytes at \off: ymm2 = u (group g), ymm3 = u (group g + 4) */
        .macro  nibbles off
        vmovdqa \off(%rdi), %ymm2
        vpsrlw  $4, %ymm2, %ymm3
        vpand   Q0_M0F(%rbx), %ymm2, %ymm2
        vpand   Q0_M0F(%rbx), %ymm3, %ymm3
        .endm

        /* p16[i] (+)= vpmaddubsw(u_lo, X_g) + vpmaddubsw(u_hi, X_g+4); ymm0 = X_g, ymm1 = X_g+4 */
        .macro  q4m_vec off, i, g
        nibbles \off
        vpmaddubsw %ymm0, %ymm2, %ymm2
        vpmaddubsw %ymm1, %ymm3, %ymm3
        .if \g == 0
        vpaddw  %ymm3, %ymm2, %ymm\i
        .else
        vpaddw  %ymm2, %ymm\i, %ymm\i
        vpaddw  %ymm3, %ymm\i, %ymm\i
        .endif
        .endm

        .macro  q4_avx2_blk
        .irp    g, 0, 1, 2, 3
        vpbroadcastd 4*\g(%rax), %ymm0
        vpbroadcastd 4*\g+16(%rax), %ymm1
        each_vec q4m_vec, \g, \g
        .endr
        vpbroadcastd (%rsp,%r11,4), %ymm0       // -8 * sum(xq of the block)
        .irp    i, 4, 5, 6, 7, 8, 9, 10, 11
        vpmaddwd Q0_ONES(%rbx), %ymm\i, %ymm\i  // int32 sums of u * xq
        vpaddd  %ymm0, %ymm\i, %ymm\i           // s
        .endr
        flt_rec
        .endm

        .macro  q4v_vec off, i
        nibbles \off
        {vex} vpdpbusd %ymm0, %ymm2, %ymm\i
        {vex} vpdpbusd %ymm1, %ymm3, %ymm\i
        .endm

        .macro  q4_avxvnni_blk
        init_corr
        pf_head Q0_PFD_Q4
        .irp    g, 0, 1, 2, 3
        vpbroadcastd 4*\g(%rax), %ymm0
        vpbroadcastd 4*\g+16(%rax), %ymm1
        pf_group Q0_PFD_Q4, \g
        each_vec q4v_vec, \g
        .endr
        flt_rec
        .endm

/*
 * void gpt2asm_matvec_q8_0_avx2(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
 *                               float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *   for t in tile_begin .. tile_end-1, o = 64t + j (j < 64):
 *       acc = +0.0;  for b in 0 .. n_in/32-1:  s = sum_i w[o][32b+i] * xq[32b+i] (exact int32);
 *                                              acc = fma((float)s, xd[b] * dw[o][b], acc)
 *       y[o] = b ? acc + b[o] : acc
 *   w: the q8_0 tiled records (2176 bytes each), 64-byte aligned.  xq, xd, b, y: any alignment.
 *   xq in -127..127 (the quantizer's range: the sign trick needs xq != -128).
 */
function gpt2asm_matvec_q8_0_avx2
        mv_q0   2176, 0, q8_avx2_blk
endfunc

/* void gpt2asm_matvec_q8_0_avxvnni(same as gpt2asm_matvec_q8_0_avx2);  any int8 xq.  AVX-VNNI. */
function gpt2asm_matvec_q8_0_avxvnni
        mv_q0   2176, 7, q8_avxvnni_blk
endfunc

/*
 * void gpt2asm_matvec_q4_0_avx2(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
 *                               float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *   the same sequence with the q4_0 records (1152 bytes each, ints w = nibble - 8); any int8 xq.
 */
function gpt2asm_matvec_q4_0_avx2
        mv_q0   1152, 3, q4_avx2_blk
endfunc

/* void gpt2asm_matvec_q4_0_avxvnni(same as gpt2asm_matvec_q4_0_avx2);  AVX-VNNI. */
function gpt2asm_matvec_q4_0_avxvnni
        mv_q0   1152, 3, q4_avxvnni_blk
endfunc

/*
 * q6_k decode, AVX2 (no VNNI): the LM head of q4_0 models on CPUs without AVX512-VNNI.  docs/kernels.md
 * "gpt2asm_{matvec,matmul}_q6_k_<isa>" (the layout; the per-output sequence: s = sc0 * S0 + sc1 * S1 exact,
 * t = xd[b] * d, acc = fma((float)s, t, acc), y = acc + b).  A record (64 outputs x 32 inputs) is taken
 * column by column (8 outputs: a 32-byte slice of each of its 4 P rows and 2 H rows), every group's
 * operand made whole, u = nibble | 16 hi (0..63, unsigned):
 *     u_g  = (P_g%4 & 0x0f  or  P_g%4 >> 4 & 0x0f) | (H_g%2 shifted so field g/2 is at bits 4-5) & 0x30
 *     m    = vpmaddubsw(u_g, X_g) + vpmaddubsw(u_g+1, X_g+1)          int16, |m| <= 2*2*63*128 = 32256
 *     s   += vpmaddwd(m, SC_h)   (SC_h: the half's sc in both int16 words of each output's dword)
 * for the pairs (0,1), (2,3) (half 0, sc0) and (4,5), (6,7) (half 1, sc1), s starting at
 * 32 * vpmaddwd((sc0, sc1), (-sum xq(0-15), -sum xq(16-31))) (u = q + 32): s = sc0 * S0 + sc1 * S1, exact.
 * Then the fp32 step per column, the tile's 64 sums kept in y itself (loaded, fma'd, stored: float32 both
 * ways, no bit changes) and y = acc + b at the end.  Any int8 xq.  ~70 ops per column, ~570 per record,
 * against ~760 for the one-token call of gpt2asm_matmul_q6_k_avx2 it replaced.  Measured (Zen 4, head
 * 768 x 50304, 31.7 MB, 15 interleaved rounds x 3): from DRAM 1297-1348 us (0.72-0.75 of a plain read)
 * against 1376-1412 (0.68-0.72); in L2 23.1 against 18.0 GB/s: still bound by its ops, so prefetching
 * 2-8 KiB ahead only cost (0.67-0.75).
 * Registers: ymm0 s, ymm1-3 operands / temps, ymm4 SC, ymm5-12 X_0..X_7 (one record), ymm13 the record's
 * correction pair, ymm14 bytes 0x30, ymm15 bytes 0x0f; r12 the super-record's d's; table (rsp): -32 sum
 * xq of each half of each block (8 bytes a block).
 */
        /* ymm\u = u of group g, column j (the nibble, then the high bits or'ed in); ymm\t: temp */
        .macro  q6a_u g, j, u, t
        .if \g < 4
        vpand   128+256*\g+32*\j(%rdi), %ymm15, %ymm\u
        .else
        vpsrlw  $4, 128+256*(\g-4)+32*\j(%rdi), %ymm\u
        vpand   %ymm15, %ymm\u, %ymm\u
        .endif
        .if \g / 2 == 0
        vpsllw  $4, 1152+256*(\g%2)+32*\j(%rdi), %ymm\t
        vpand   %ymm14, %ymm\t, %ymm\t
        .elseif \g / 2 == 1
        vpsllw  $2, 1152+256*(\g%2)+32*\j(%rdi), %ymm\t
        vpand   %ymm14, %ymm\t, %ymm\t
        .elseif \g / 2 == 2
        vpand   1152+256*(\g%2)+32*\j(%rdi), %ymm14, %ymm\t
        .else
        vpsrlw  $2, 1152+256*(\g%2)+32*\j(%rdi), %ymm\t
        vpand   %ymm14, %ymm\t, %ymm\t
        .endif
        vpor    %ymm\t, %ymm\u, %ymm\u
        .endm

        /* s += vpmaddwd(vpmaddubsw(u_g, X_g) + vpmaddubsw(u_g+1, X_g+1), SC) for column j; X_g = ymm\xa,
           X_g+1 = ymm\xb (ymm5 + g) */
        .macro  q6a_pair g, xa, xb, j
        q6a_u   \g, \j, 1, 2
        vpmaddubsw %ymm\xa, %ymm1, %ymm1
        q6a_u   (\g+1), \j, 2, 3
        vpmaddubsw %ymm\xb, %ymm2, %ymm2
        vpaddw  %ymm2, %ymm1, %ymm1
        vpmaddwd %ymm4, %ymm1, %ymm1
        vpaddd  %ymm1, %ymm0, %ymm0
        .endm

        /* column j: outputs 8j .. 8j+7 of the record */
        .macro  q6a_col j
        vmovq   8*\j(%rdi), %xmm1               // sc0 of the 8 outputs
        vmovq   64+8*\j(%rdi), %xmm2            // sc1
        vpunpcklbw %xmm2, %xmm1, %xmm1          // (sc0, sc1) per output
        vpmovsxbw %xmm1, %ymm4                  // as int16 pairs
        vpmaddwd %ymm13, %ymm4, %ymm0           // -(sc0 sum0 + sc1 sum1)
        vpslld  $5, %ymm0, %ymm0                // s = -32 (sc0 sum0 + sc1 sum1)
        vpmovsxbd 8*\j(%rdi), %ymm4
        vpshufb Q0_DUPW(%rbx), %ymm4, %ymm4     // sc0 in both words
        q6a_pair 0, 5, 6, \j
        q6a_pair 2, 7, 8, \j
        vpmovsxbd 64+8*\j(%rdi), %ymm4
        vpshufb Q0_DUPW(%rbx), %ymm4, %ymm4     // sc1 in both words
        q6a_pair 4, 9, 10, \j
        q6a_pair 6, 11, 12, \j
        vbroadcastss (%rdx,%r11,4), %ymm3       // xd[b]
        vcvtph2ps 16*\j(%r12), %ymm1            // d
        vmulps  %ymm1, %ymm3, %ymm1             // t = xd[b] * d
        vcvtdq2ps %ymm0, %ymm0
        vmovups 32*\j(%r8), %ymm2
        vfmadd231ps %ymm1, %ymm0, %ymm2         // acc = fma(s, t, acc)
        vmovups %ymm2, 32*\j(%r8)
        .endm

        .macro  q6_avx2_blk
        testb   $7, %r11b
        jnz     .Lq6a\@
        movq    %rdi, %r12                      // a super-record: its 64 d's, then its first record
        addq    $128, %rdi
.Lq6a\@:
        vmovq   (%rsp,%r11,8), %xmm13           // -32 sum(xq of each half)
        vpsrad  $5, %xmm13, %xmm13
        vpackssdw %xmm13, %xmm13, %xmm13        // (-sum0, -sum1) as an int16 pair (|sum| <= 2048)
        vpbroadcastd %xmm13, %ymm13
        vpbroadcastd 0(%rax), %ymm5          // X_g, g = 0..7
        vpbroadcastd 4(%rax), %ymm6
        vpbroadcastd 8(%rax), %ymm7
        vpbroadcastd 12(%rax), %ymm8
        vpbroadcastd 16(%rax), %ymm9
        vpbroadcastd 20(%rax), %ymm10
        vpbroadcastd 24(%rax), %ymm11
        vpbroadcastd 28(%rax), %ymm12
        .irp    j, 0, 1, 2, 3, 4, 5, 6, 7
        q6a_col \j
        .endr
        .endm

        .purgem q0_consts
        .macro  q0_consts
        movrel  %rbx, q0_mv_avx2
        vmovdqa Q0_M30(%rbx), %ymm14
        vmovdqa Q0_M0F(%rbx), %ymm15
        .endm
        .purgem q0_zero
        .macro  q0_zero                         // the tile's sums live in y
        vxorps  %ymm0, %ymm0, %ymm0
        vstore  %r8, 0, 32, ymm, 0,0,0,0,0,0,0,0
        .endm
        .purgem q0_store
        .macro  q0_store
        testq   %rcx, %rcx
        jz      1f
        .irp    j, 0, 1, 2, 3, 4, 5, 6, 7
        vmovups 32*\j(%r8), %ymm0
        vaddps  32*\j(%rcx), %ymm0, %ymm0       // y = acc + b
        vmovups %ymm0, 32*\j(%r8)
        .endr
1:
        .endm
        .set    Q0_SPILL, 0

/*
 * void gpt2asm_matvec_q6_k_avx2(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
 *                               float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *   for t in tile_begin .. tile_end-1, o = 64t + j (j < 64):
 *       acc = +0.0;  for b in 0 .. n_in/32-1:
 *           S0 = sum_{i<16} q[o][32b+i] * xq[32b+i],  S1 = sum_{16<=i<32} ...   (exact int32)
 *           s = sc[o][2b] * S0 + sc[o][2b+1] * S1;  t = xd[b] * d[o][b/8];  acc = fma((float)s, t, acc)
 *       y[o] = b ? acc + b[o] : acc
 *   w: the q6_k tiled super-records (13440 bytes per 256 inputs and tile), 64-byte aligned; n_in % 256 == 0.
 *   Any int8 xq.  AVX2 + FMA + F16C: the decode of CPUs without AVX512-VNNI.
 */
function gpt2asm_matvec_q6_k_avx2
        mv_q0   1664, 5, q6_avx2_blk, 1680, 1, 5
endfunc
