/*
 * asm/x86_64/matvec_q0_avx512.S -- q8_0 / q4_0 decode (matrix-vector) kernels, AVX-512 BW and
 * AVX-512 VNNI (zmm).
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
 * t, acc) (vcvtdq2ps, vfmadd231ps); at the end y = acc + b.  Only zmm0-15 are used (vzeroupper then
 * leaves no dirty upper state); AVX512F + BW (+ VNNI for the _avx512vnni kernels).
 *
 * Registers: see matvec_q0.h; zmm8 X (then xd[b]), zmm9 -X / 0x80 bytes / X_g+4, zmm10-11 and 13-15
 * temps, zmm12 int16 ones, k1 signs; rbx the constants.
 */
#include "asm.S"
#include "q0_const.h"

        q0_const q0_mv_avx512, 64

        .macro  q0_consts
        movrel  %rbx, q0_mv_avx512
        .endm

        .macro  q0_zero
        vclear  vpxord, zmm, 0, 1, 2, 3
        .endm

        .macro  q0_exit
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

        /* acc[f] = fma((float)s[i], xd[b] * dw[16 outputs at record byte \off], acc[f]) */
        .macro  flt1 off, i, f
        vcvtph2ps \off(%rdi), %zmm10
        vmulps  %zmm10, %zmm8, %zmm10           // t = xd[b] * dw
        vcvtdq2ps %zmm\i, %zmm11
        vfmadd231ps %zmm10, %zmm11, %zmm\f      // acc = fma(s, t, acc)
        .endm

        .macro  flt_rec
        vbroadcastss (%rdx,%r11,4), %zmm8
        flt1    0, 4, 0
        flt1    32, 5, 1
        flt1    64, 6, 2
        flt1    96, 7, 3
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
        .endm

        .macro  q8_avx512_blk
        vpbroadcastd Q0_ONES(%rbx), %zmm12
        vpxord  %zmm13, %zmm13, %zmm13
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vpbroadcastd 4*\g(%rax), %zmm8
        vpsubb  %zmm8, %zmm13, %zmm9            // -X (xq != -128)
        each_off q8s_vec, 128+256*\g, 64, \g, 4, 5, 6, 7
        .endr
        flt_rec
        .endm

        .macro  q8v_vec off, i
        vpxord  \off(%rdi), %zmm9, %zmm10       // w + 128, unsigned
        vpdpbusd %zmm8, %zmm10, %zmm\i
        .endm

        .macro  q8_avx512vnni_blk
        vpbroadcastd Q0_K80(%rbx), %zmm9
        init_corr
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vpbroadcastd 4*\g(%rax), %zmm8
        each_off q8v_vec, 128+256*\g, 64, , 4, 5, 6, 7
        .endr
        flt_rec
        .endm

        /* zmm10 = u of group g (low nibbles), zmm11 = u of group g + 4 (high nibbles) */
        .macro  nibbles off
        vmovdqa64 \off(%rdi), %zmm10
        vpsrlw  $4, %zmm10, %zmm11
        vpandd  Q0_M0F(%rbx){1to16}, %zmm10, %zmm10
        vpandd  Q0_M0F(%rbx){1to16}, %zmm11, %zmm11
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
        .endm

        .macro  q4_avx512_blk
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

        .macro  q4v_vec off, i
        nibbles \off
        vpdpbusd %zmm8, %zmm10, %zmm\i
        vpdpbusd %zmm9, %zmm11, %zmm\i
        .endm

        .macro  q4_avx512vnni_blk
        init_corr
        .irp    g, 0, 1, 2, 3
        vpbroadcastd 4*\g(%rax), %zmm8
        vpbroadcastd 4*\g+16(%rax), %zmm9
        each_off q4v_vec, 128+256*\g, 64, , 4, 5, 6, 7
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

/* void gpt2asm_matvec_q8_0_avx512vnni(same);  any int8 xq.  AVX512F + BW + VNNI. */
function gpt2asm_matvec_q8_0_avx512vnni
        mv_q0   2176, 7, q8_avx512vnni_blk
endfunc

/* void gpt2asm_matvec_q4_0_avx512(same as q8_0, the q4_0 records);  AVX512F + BW. */
function gpt2asm_matvec_q4_0_avx512
        mv_q0   1152, 3, q4_avx512_blk
endfunc

/* void gpt2asm_matvec_q4_0_avx512vnni(same);  AVX512F + BW + VNNI. */
function gpt2asm_matvec_q4_0_avx512vnni
        mv_q0   1152, 3, q4_avx512vnni_blk
endfunc
