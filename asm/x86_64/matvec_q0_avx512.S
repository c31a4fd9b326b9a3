/*
 * asm/x86_64/matvec_q0_avx512.S -- q8_0 / q4_0 decode (matrix-vector) kernels, AVX-512 BW and
 * AVX-512 VNNI (zmm); and q6_k's (gpt2asm_matvec_q6_k_avx512vnni, at the end of the file).
 *
 * The sequence of matvec_q0_avx2.S (docs/kernels.md "q8_0 / q4_0"; numpy model tests/q0ref.py, matvec), a whole
 * record per pass: the tile's 64 fp32 sums in zmm0-3, the record's 64 int32 block sums in zmm4-7 (one
 * 64-byte line of a group = 16 outputs x 4 inputs = one zmm), so a record streams front to back.  Per
 * group g, X = xq[32b+4g .. +3] broadcast as a dword:
 *   q8_0 avx512      (sign trick) k = vpmovb2m(w); p = vpmaddubsw(|w|, k ? -X : X) (vpabsb, vpblendmb);
 *                    s += vpmaddwd(p, 1)                                    (6 ops + 1 load per 64 bytes)
 *   q8_0 avx512vnni  s += vpdpbusd(w ^ 0x80, X); s starts at -128 * sum(xq of block)   (2 ops per 64 bytes)
 *   q4_0 avx512      p16 += vpmaddubsw(u_lo, X_g) + vpmaddubsw(u_hi, X_g+4) (u = nibble = w + 8, int16,
 *                    |p16| < 2^15), s = vpmaddwd(p16, 1) - 8 * sum(xq of block)   (7 ops per 64 bytes)
 *   q4_0 avx512vnni  s += vpdpbusd(u_lo, X_g) + vpdpbusd(u_hi, X_g+4); s starts at -8 * sum(xq)  (5 ops)
 * then per output: t = xd[b] * dw (vbroadcastss, vcvtph2ps, vmulps with xd first); acc = fma((float)s,
 * t, acc) (vcvtdq2ps, vfmadd231ps); at the end y = acc + b.  The record's 64 dw are widened first
 * (zmm16-19, at the start of the record, so its lines are touched strictly front to back), and after each
 * 64-byte line's ops come PAD_* nops: a throttle.  Measured (2026-12-03, Zen 4, weights in DRAM): with few
 * ops per line (VNNI q8_0: 2) 0.80-0.85 of a plain read, with ~10 (nops included) 0.95-1.0; our reading:
 * the out-of-order window otherwise runs ~100 lines ahead and its demand misses crowd out the hardware
 * prefetchers (docs/notes.md).  The nops change no result.  zmm16-19 are zeroed
 * before vzeroupper (which leaves zmm16-31); AVX512F + BW (+ VNNI for the _avx512vnni kernels).
 *
 * Registers: see matvec_q0.h; zmm8 X (then xd[b]), zmm9 -X / 0x80 bytes / X_g+4, zmm10-11 temps, zmm12
 * int16 ones, zmm13 zero, zmm14 0x0f bytes, zmm16-19 the record's dw, k1 signs; rbx the constants.
 */
#include "asm.S"
#include "q0_const.h"

        q0_const q0_mv_avx512, 64
        .set    Q0_SPILL, 0                     // the fp32 sums all in registers
        .set    Q0_HI, 0                        // q0_exit: zmm20-29 used too (q6_k)

        /* nops after each 64-byte line's ops, per kernel (the throttle: see above).  The VNNI kernels come
         * in two tunings with the same code otherwise: gpt2asm_matvec_*_avx512vnni without nops (Zen 5:
         * 0.94 of a read for q8_0 against 0.70 with 8 nops) and gpt2asm_matvec_*_avx512vnni_zen4 with
         * them (Zen 4: 0.95-1.0 against 0.80-0.85 without); Python picks by CPU (q0kernels.mv_variant).
         * -D<name>_N overrides a count for experiments. */
#ifndef PAD_Q8S_N
#define PAD_Q8S_N 4
#endif
#ifndef PAD_Q4M_N
#define PAD_Q4M_N 4
#endif
#ifndef PAD_Q8V_N
#define PAD_Q8V_N 0
#endif
#ifndef PAD_Q4V_N
#define PAD_Q4V_N 0
#endif
#ifndef PAD_Q8V_ZEN4_N
#define PAD_Q8V_ZEN4_N 8
#endif
#ifndef PAD_Q4V_ZEN4_N
#define PAD_Q4V_ZEN4_N 4
#endif
        .set    PAD_Q8S, PAD_Q8S_N
        .set    PAD_Q4M, PAD_Q4M_N

        .macro  pad n
        .rept   \n
        nop
        .endr
        .endm


        .macro  q0_consts
        movrel  %rbx, q0_mv_avx512
        .endm

        .macro  q0_zero
        vclear  vpxord, zmm, 0, 1, 2, 3
        .endm

        .macro  q0_exit
        vclear  vpxord, zmm, 16, 17, 18, 19     // vzeroupper leaves zmm16-31 as they are
        .if Q0_HI
        vclear  vpxord, zmm, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31   // (q6_k's)
        .endif
        vzeroupper
        ret
        .endm

        .macro  q0_store
        testq   %rcx, %rcx
        jz      1f
        vmemop  vaddps, %rcx, 0, 64, zmm, 0,1,2,3  // y = acc + b
1:
        vstore  %r8, 0, 64, zmm, 0,1,2,3
        .endm

#include "matvec_q0.h"

        /* the record's 64 dw widened first (its first two lines are fetched first): zmm16-19 */
        .macro  dw_rec
        vcvtph2ps 0(%rdi), %zmm16
        vcvtph2ps 32(%rdi), %zmm17
        vcvtph2ps 64(%rdi), %zmm18
        vcvtph2ps 96(%rdi), %zmm19
        .endm

        /* acc[f] = fma((float)s[i], xd[b] * dw[d], acc[f]); zmm8 = xd[b] */
        .macro  flt1 i, d, f
        vmulps  %zmm\d, %zmm8, %zmm10           // t = xd[b] * dw
        vcvtdq2ps %zmm\i, %zmm11
        vfmadd231ps %zmm10, %zmm11, %zmm\f      // acc = fma(s, t, acc)
        .endm

        .macro  flt_rec
        vbroadcastss (%rdx,%r11,4), %zmm8
        flt1    4, 16, 0
        flt1    5, 17, 1
        flt1    6, 18, 2
        flt1    7, 19, 3
        .endm

        .macro  init_corr
        vpbroadcastd (%rsp,%r11,4), %zmm4       // s = -c * sum(xq of the block)
        vmovdqa64 %zmm4, %zmm5
        vmovdqa64 %zmm4, %zmm6
        vmovdqa64 %zmm4, %zmm7
        .endm

        /* sign trick: zmm8 = X, zmm9 = -X, zmm12 = int16 ones */
        .macro  q8s_vec off, i, g
        vmovdqa64 \off(%rdi), %zmm10
        vpmovb2m %zmm10, %k1                    // w < 0
        vpabsb  %zmm10, %zmm10                  // |w| (128 for -128: unsigned)
        vpblendmb %zmm9, %zmm8, %zmm11{%k1}     // X * sign(w)  (w = 0: |w| = 0 anyway)
        vpmaddubsw %zmm11, %zmm10, %zmm10       // int16 pair sums, exact
        .if \g == 0
        vpmaddwd %zmm12, %zmm10, %zmm\i
        .else
        vpmaddwd %zmm12, %zmm10, %zmm10
        vpaddd  %zmm10, %zmm\i, %zmm\i
        .endif
        pad     PAD_Q8S
        .endm

        .macro  q8_avx512_blk
        dw_rec
        vpbroadcastd Q0_ONES(%rbx), %zmm12
        vpxord  %zmm13, %zmm13, %zmm13
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vpbroadcastd 4*\g(%rax), %zmm8
        vpsubb  %zmm8, %zmm13, %zmm9            // -X (xq != -128)
        each_off q8s_vec, 128+256*\g, 64, \g, 4, 5, 6, 7
        .endr
        flt_rec
        .endm

        .macro  q8v_vec off, i, np
        vpxord  \off(%rdi), %zmm9, %zmm10       // w + 128, unsigned
        vpdpbusd %zmm8, %zmm10, %zmm\i
        pad     \np
        .endm

        .macro  q8_avx512vnni_blk np
        dw_rec
        vpbroadcastd Q0_K80(%rbx), %zmm9
        init_corr
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vpbroadcastd 4*\g(%rax), %zmm8
        each_off q8v_vec, 128+256*\g, 64, \np, 4, 5, 6, 7
        .endr
        flt_rec
        .endm

        /* zmm10 = u of group g (low nibbles), zmm11 = u of group g + 4 (high nibbles); zmm14 = 0x0f bytes */
        .macro  nibbles off
        vmovdqa64 \off(%rdi), %zmm10
        vpsrlw  $4, %zmm10, %zmm11
        vpandd  %zmm14, %zmm10, %zmm10
        vpandd  %zmm14, %zmm11, %zmm11
        .endm

        .macro  q4m_vec off, i, g
        nibbles \off
        vpmaddubsw %zmm8, %zmm10, %zmm10
        vpmaddubsw %zmm9, %zmm11, %zmm11
        .if \g == 0
        vpaddw  %zmm11, %zmm10, %zmm\i
        .else
        vpaddw  %zmm10, %zmm\i, %zmm\i
        vpaddw  %zmm11, %zmm\i, %zmm\i
        .endif
        pad     PAD_Q4M
        .endm

        .macro  q4_avx512_blk
        dw_rec
        vpbroadcastd Q0_M0F(%rbx), %zmm14
        .irp    g, 0, 1, 2, 3
        vpbroadcastd 4*\g(%rax), %zmm8
        vpbroadcastd 4*\g+16(%rax), %zmm9
        each_off q4m_vec, 128+256*\g, 64, \g, 4, 5, 6, 7
        .endr
        vpbroadcastd Q0_ONES(%rbx), %zmm12
        .irp    i, 4, 5, 6, 7
        vpmaddwd %zmm12, %zmm\i, %zmm\i                 // int32 sums of u * xq
        vpaddd  (%rsp,%r11,4){1to16}, %zmm\i, %zmm\i    // - 8 * sum(xq of the block)
        .endr
        flt_rec
        .endm

        .macro  q4v_vec off, i, np
        nibbles \off
        vpdpbusd %zmm8, %zmm10, %zmm\i
        vpdpbusd %zmm9, %zmm11, %zmm\i
        pad     \np
        .endm

        .macro  q4_avx512vnni_blk np
        dw_rec
        vpbroadcastd Q0_M0F(%rbx), %zmm14
        init_corr
        .irp    g, 0, 1, 2, 3
        vpbroadcastd 4*\g(%rax), %zmm8
        vpbroadcastd 4*\g+16(%rax), %zmm9
        each_off q4v_vec, 128+256*\g, 64, \np, 4, 5, 6, 7
        .endr
        flt_rec
        .endm

/*
 * void gpt2asm_matvec_q8_0_avx512(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
 *                                 float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *   as gpt2asm_matvec_q8_0_avx2 (the same sequence and bits); xq in -127..127.  AVX512F + BW.
 */
function gpt2asm_matvec_q8_0_avx512
        mv_q0   2176, 0, q8_avx512_blk
endfunc

        /* the VNNI bodies in their two tunings (the nops per line) */
        .macro  q8v_blk
        q8_avx512vnni_blk PAD_Q8V_N
        .endm
        .macro  q8v_blk_zen4
        q8_avx512vnni_blk PAD_Q8V_ZEN4_N
        .endm
        .macro  q4v_blk
        q4_avx512vnni_blk PAD_Q4V_N
        .endm
        .macro  q4v_blk_zen4
        q4_avx512vnni_blk PAD_Q4V_ZEN4_N
        .endm

/* void gpt2asm_matvec_q8_0_avx512vnni(same);  any int8 xq.  AVX512F + BW + VNNI. */
function gpt2asm_matvec_q8_0_avx512vnni
        mv_q0   2176, 7, q8v_blk
endfunc

/* void gpt2asm_matvec_q8_0_avx512vnni_zen4(same): the same code with the Zen 4 throttle. */
function gpt2asm_matvec_q8_0_avx512vnni_zen4
        mv_q0   2176, 7, q8v_blk_zen4
endfunc

/* void gpt2asm_matvec_q4_0_avx512(same as q8_0, the q4_0 records);  AVX512F + BW. */
function gpt2asm_matvec_q4_0_avx512
        mv_q0   1152, 3, q4_avx512_blk
endfunc

/* void gpt2asm_matvec_q4_0_avx512vnni(same);  AVX512F + BW + VNNI. */
function gpt2asm_matvec_q4_0_avx512vnni
        mv_q0   1152, 3, q4v_blk
endfunc

/* void gpt2asm_matvec_q4_0_avx512vnni_zen4(same): the same code with the Zen 4 throttle. */
function gpt2asm_matvec_q4_0_avx512vnni_zen4
        mv_q0   1152, 3, q4v_blk_zen4
endfunc

/*
 * q6_k (docs/kernels.md "gpt2asm_{matvec,matmul}_q6_k_<isa>"; numpy model tests/q0ref.py matvec_q6k): the
 * tile's super-records stream front to back.  At a super-record's start r12 = its 64 d's (the header's two
 * lines touched there, widened again per record) and rdi steps over the header; then per record (block b,
 * 1664 bytes), strictly in address order, with u = lo + 16 hi (lo: 4 bits from P, hi: 2 bits from H) and
 * X_g = xq[32b+4g .. +3] broadcast (zmm16-17 for a P group, zmm16-19 for an H row), per line (16 outputs
 * 16j.. x 4 inputs of each group):
 *   sc line   vpmovsxbd (the record's first line touched first)
 *   P lines   (group g < 4): A0 += vpdpbusd(P & 0x0f, X_g)            (lo of group g)
 *                            D  += vpdpbusd(P & 0xf0, X_g+4)          (16 lo of group g + 4)
 *   H lines   (g' = 0, 1), T = H >> 2 (vpsrlw):
 *                            E  += vpdpbusd(H & 0x03, X_g')  + vpdpbusd(T & 0x03, X_g'+2)    (hi, half 0)
 *                            A1 += vpdpbusd(H & 0x30, X_g'+4) + vpdpbusd(T & 0x30, X_g'+6)   (16 hi, half 1)
 * E starts at -2 * sum(xq of inputs 0-15), A1 at -32 * sum(xq of 16-31) (the driver's table), A0 and D at
 * 0; then
 *   S0 = A0 + 16 E  (vpdpwssd with the int16 pair (16, 0): |E| <= 16*3*128 + 2*2048 < 2^15, exact)
 *   S1 = A1 + D / 16  (vpsrad: D is 16 * an integer)
 * exactly the contract's half sums; s = sc0 * S0 + sc1 * S1 (vpmovsxbd, vpmulld, vpaddd; |s| < 2^24),
 * t = xd[b] * d (xd first), acc = fma((float)s, t, acc).  Any int8 xq.
 * Speed (Zen 5, weights in DRAM, python tests/test_kernels_q6k.py --bench): ~8.5 ops per 64-byte line
 * (4 per P line, 9 per H line, ~60 per record besides) stream at only 0.87-0.92 of a plain read: the
 * out-of-order window runs too few lines ahead of the oldest miss (the same code with the H lines cut to
 * 2 ops, wrong results, ran at 0.95-1.0).  So each line's ops start with a prefetcht0 Q6_PFD = 6144 bytes
 * (~3.7 records) ahead, one forward stream: 1.0-1.07 of the read (4096: ~1.04, 8192-10240: ~1.05,
 * 16384: ~0.92; prefetcht1: ~0.95).  Prefetches past the range's end do not fault.  On Zen 4 the same hints
 * cost: 0.72 of a read with them, 0.94-0.95 without (2048: 0.85, 4096: 0.76, 12288: 0.75; 1-8 nops a line
 * instead: 0.93-0.98, noise), so gpt2asm_matvec_q6_k_avx512vnni_zen4 is this body without them (Python picks
 * it on Zen 4: q0kernels.mv_variant).
 * Registers: zmm0-3 fp32 sums, zmm4-7 A0, zmm8-11 A1, zmm12-15 the masks 0x0f, 0x30, 0xf0, 0x03 bytes,
 * zmm16-19 X, zmm20-23 E, zmm24-27 D, zmm28 T / xd, zmm29-30 masked operands / temps, zmm31 sc; r12 the
 * super-record's d's; the table at rsp (8 bytes a block); zmm16-31 are zeroed before returning.
 */
#ifndef Q6_PFD
#define Q6_PFD 6144                             /* prefetch distance in bytes (0: none) */
#endif
        .set    Q6_PF, Q6_PFD                   // this kernel's distance (the _zen4 tuning: 0)
        .macro  q6pf off
        .if Q6_PF
        prefetcht0 \off+Q6_PF(%rdi)
        .endif
        .endm

        /* a P line of group g (A0 = zmm\j, D = zmm2\j); zmm16 = X_g, zmm17 = X_g+4 */
        .macro  q6p_line off, j
        q6pf    \off
        vpandd  \off(%rdi), %zmm12, %zmm29      // lo, group g
        vpdpbusd %zmm16, %zmm29, %zmm\j
        vpandd  \off(%rdi), %zmm14, %zmm30      // 16 lo, group g + 4
        vpdpbusd %zmm17, %zmm30, %zmm2\j
        .endm

        /* an H line of row g' (E = zmm2\j, A1 = zmm\a1); zmm16-19 = X_g', X_g'+2, X_g'+4, X_g'+6 */
        .macro  q6h_line off, j, a1
        q6pf    \off
        vpsrlw  $2, \off(%rdi), %zmm28          // T
        vpandd  \off(%rdi), %zmm15, %zmm29      // hi, group g'
        vpdpbusd %zmm16, %zmm29, %zmm2\j
        vpandd  \off(%rdi), %zmm13, %zmm30      // 16 hi, group g' + 4
        vpdpbusd %zmm18, %zmm30, %zmm\a1
        vpandd  %zmm15, %zmm28, %zmm29          // hi, group g' + 2
        vpdpbusd %zmm17, %zmm29, %zmm2\j
        vpandd  %zmm13, %zmm28, %zmm30          // 16 hi, group g' + 6
        vpdpbusd %zmm19, %zmm30, %zmm\a1
        .endm

        /* s (into A0 = zmm\a0) of outputs 16j..: S0 = A0 + 16 E, S1 = A1 + D / 16, s = sc0 * S0 + sc1 * S1 */
        .macro  q6_fold a0, a1, e, d, scoff
        vpdpwssd Q0_W16(%rbx){1to16}, %zmm\e, %zmm\a0    // S0 = A0 + 16 E (E as int16)
        vpsrad  $4, %zmm\d, %zmm\d
        vpaddd  %zmm\d, %zmm\a1, %zmm\a1                 // S1 = A1 + D / 16
        vpmovsxbd \scoff(%rdi), %zmm31
        vpmulld %zmm31, %zmm\a0, %zmm\a0                 // sc0 * S0
        vpmovsxbd \scoff+64(%rdi), %zmm29
        vpmulld %zmm29, %zmm\a1, %zmm\a1                 // sc1 * S1
        vpaddd  %zmm\a1, %zmm\a0, %zmm\a0                // s
        .endm

        /* acc[f] = fma((float)s[i], xd[b] * d (at r12 + \off, widened), acc[f]); zmm28 = xd[b] */
        .macro  q6_flt off, i, f
        vcvtph2ps \off(%r12), %zmm29
        vmulps  %zmm29, %zmm28, %zmm29          // t = xd[b] * d
        vcvtdq2ps %zmm\i, %zmm30
        vfmadd231ps %zmm29, %zmm30, %zmm\f      // acc = fma(s, t, acc)
        .endm

        .macro  q6_avx512vnni_blk
        testb   $7, %r11b
        jnz     .Lq6h\@
        movq    %rdi, %r12                      // a super-record: its 64 d's, then its first record
        vcvtph2ps 0(%rdi), %zmm29               // (the header's lines touched first)
        vcvtph2ps 64(%rdi), %zmm30
        addq    $128, %rdi
.Lq6h\@:
        vpmovsxbd 0(%rdi), %zmm29               // (the sc line touched first)
        vpbroadcastd (%rsp,%r11,8), %zmm20      // E = -2 * sum(xq of inputs 0-15)
        vpbroadcastd 4(%rsp,%r11,8), %zmm8      // A1 = -32 * sum(xq of inputs 16-31)
        vmovdqa64 %zmm20, %zmm21
        vmovdqa64 %zmm20, %zmm22
        vmovdqa64 %zmm20, %zmm23
        vmovdqa64 %zmm8, %zmm9
        vmovdqa64 %zmm8, %zmm10
        vmovdqa64 %zmm8, %zmm11
        vclear  vpxord, zmm, 4, 5, 6, 7, 24, 25, 26, 27
        .irp    g, 0, 1, 2, 3
        vpbroadcastd 4*\g(%rax), %zmm16
        vpbroadcastd 4*\g+16(%rax), %zmm17
        q6p_line 128+256*\g, 4
        q6p_line 128+256*\g+64, 5
        q6p_line 128+256*\g+128, 6
        q6p_line 128+256*\g+192, 7
        .endr
        .irp    g, 0, 1
        vpbroadcastd 4*\g(%rax), %zmm16
        vpbroadcastd 4*\g+8(%rax), %zmm17
        vpbroadcastd 4*\g+16(%rax), %zmm18
        vpbroadcastd 4*\g+24(%rax), %zmm19
        q6h_line 1152+256*\g, 0, 8
        q6h_line 1152+256*\g+64, 1, 9
        q6h_line 1152+256*\g+128, 2, 10
        q6h_line 1152+256*\g+192, 3, 11
        .endr
        q6_fold 4, 8, 20, 24, 0
        q6_fold 5, 9, 21, 25, 16
        q6_fold 6, 10, 22, 26, 32
        q6_fold 7, 11, 23, 27, 48
        vbroadcastss (%rdx,%r11,4), %zmm28
        q6_flt  0, 4, 0
        q6_flt  32, 5, 1
        q6_flt  64, 6, 2
        q6_flt  96, 7, 3
        .endm

        .macro  q6_consts
        movrel  %rbx, q0_mv_avx512
        vpbroadcastd Q0_M0F(%rbx), %zmm12
        vpbroadcastd Q0_M30(%rbx), %zmm13
        vpbroadcastd Q0_MF0(%rbx), %zmm14
        vpbroadcastd Q0_M03(%rbx), %zmm15
        .endm

/*
 * void gpt2asm_matvec_q6_k_avx512vnni(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
 *                                     float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *   for t in tile_begin .. tile_end-1, o = 64t + j (j < 64):
 *       acc = +0.0;  for b in 0 .. n_in/32-1:
 *           S0 = sum_{i<16} q[o][32b+i] * xq[32b+i],  S1 = sum_{16<=i<32} ...   (exact int32)
 *           s = sc[o][2b] * S0 + sc[o][2b+1] * S1;  t = xd[b] * d[o][b/8];  acc = fma((float)s, t, acc)
 *       y[o] = b ? acc + b[o] : acc
 *   w: the q6_k tiled super-records (13440 bytes per 256 inputs and tile), 64-byte aligned; n_in % 256 == 0.
 *   Any int8 xq.  AVX512F + BW + VNNI.
 */
        .purgem q0_consts
        .macro  q0_consts
        q6_consts
        .endm
        .set    Q0_HI, 1
function gpt2asm_matvec_q6_k_avx512vnni
        mv_q0   1664, 5, q6_avx512vnni_blk, 1680, 1, 1
endfunc

/*
 * void gpt2asm_matvec_q6_k_avx512vnni_zen4(<as gpt2asm_matvec_q6_k_avx512vnni>);   the same bits.
 *   The same body without the prefetch hints (Zen 4: 0.94-0.95 of a read against 0.72 with them).
 */
        .set    Q6_PF, 0
function gpt2asm_matvec_q6_k_avx512vnni_zen4
        mv_q0   1664, 5, q6_avx512vnni_blk, 1680, 1, 1
endfunc
