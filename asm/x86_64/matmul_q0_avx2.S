/*
 * asm/x86_64/matmul_q0_avx2.S -- q8_0 / q4_0 prefill (matrix-matrix) kernels, AVX2 and AVX-VNNI (ymm).
 *
 * docs/kernels.md "q8_0 / q4_0"; the blocking and the activation panel are matmul_q0.h's.  Register block: 6 tokens
 * x 8 outputs (one ymm): the 6 int32 block sums in ymm0-5, the 6 fp32 sums in ymm6-11.  Per record and
 * sub-tile, each group's 32 weight bytes are loaded and made into the dot operand once (ymm12; q4_0:
 * low / high nibbles in ymm12 / ymm13), then for each token its 4 quantized inputs are broadcast
 * (ymm14) and
 *   q8_0 avx2     s += vpmaddwd(vpmaddubsw(|w|, vpsignb(X, w)), 1)     (the sign trick, as matvec_q0)
 *   q8_0 avxvnni  s += vpdpbusd(w ^ 0x80, X), s starting at -128 * sum(xq)
 *   q4_0 avx2     p16 += vpmaddubsw(u_lo, X_g) + vpmaddubsw(u_hi, X_g+4); s = vpmaddwd(p16, 1) - 8 * sum(xq)
 *   q4_0 avxvnni  s += vpdpbusd(u_lo, X_g) + vpdpbusd(u_hi, X_g+4), s starting at -8 * sum(xq)
 * then per token t = xd * dw (vbroadcastss xd, vmulps; dw by one vcvtph2ps per record and sub-tile),
 * acc = fma((float)s, t, acc); at the end y = acc + b.  Every (token, output): the matvec's bits.
 * Per 8 outputs x 4 inputs x 6 tokens (VNNI): 6 vpdpbusd + 1-2 operand ops (q8_0), and the fp32 step per
 * block and token (vmulps, vcvtdq2ps, vfmadd231ps).  What is measured later: make bench's q8_0 / q4_0
 * TTFT against fp32's.
 *
 * Registers: matmul_q0.h's GPRs; ymm0-5 int sums, ymm6-11 fp32 sums, ymm12-13 weight operands (then dw),
 * ymm14 X (then xd), ymm15 products; rbx constants.
 */
#include "asm.S"
#include "q0_const.h"

#define MQ_TB 6
#define MQ_VL 32
        q0_const q0_mm_avx2, 32

        .macro  mq_consts
        movrel  %rbx, q0_mm_avx2
        .endm

        .macro  mq_exit
        vzeroupper
        ret
        .endm

        /* \m t, int sum register, fp32 sum register, \a for every token t < \mt */
        .macro  each_tok mt, m, a=0
        \m      0, 0, 6, \a
        .if \mt > 1
        \m      1, 1, 7, \a
        .endif
        .if \mt > 2
        \m      2, 2, 8, \a
        .endif
        .if \mt > 3
        \m      3, 3, 9, \a
        .endif
        .if \mt > 4
        \m      4, 4, 10, \a
        .endif
        .if \mt > 5
        \m      5, 5, 11, \a
        .endif
        .endm

        .macro  zero_f t, i, f, a
        vpxor   %xmm\f, %xmm\f, %xmm\f
        .endm
        .macro  zero_i t, i, f, a
        vpxor   %xmm\i, %xmm\i, %xmm\i
        .endm
        .macro  corr_i t, i, f, a
        vpbroadcastd MQ_CO+4*\t(%rax), %ymm\i   // s = -c * sum(xq[t] of the block)
        .endm

        .macro  mq_zero mt
        each_tok \mt, zero_f
        .endm

        .macro  st_tok t, i, f, a
        testq   %r15, %r15
        jz      9f
        vaddps  (%r15), %ymm\f, %ymm\f          // y = acc + b
9:
        vmovups %ymm\f, (%r13)
        addq    %r14, %r13
        .endm

        .macro  mq_store mt
        each_tok \mt, st_tok
        .endm

        /* per token: acc = fma((float)s, xd * dw, acc); ymm12 = dw */
        .macro  flt_tok t, i, f, a
        vbroadcastss MQ_XD+4*\t(%rax), %ymm14
        vmulps  %ymm12, %ymm14, %ymm15          // t = xd * dw
        vcvtdq2ps %ymm\i, %ymm13
        vfmadd231ps %ymm15, %ymm13, %ymm\f
        .endm

        .macro  flt mt
        vcvtph2ps (%r12), %ymm12
        each_tok \mt, flt_tok
        .endm

        /* q8_0, sign trick: ymm12 = |w| of group \g */
        .macro  q8s_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %ymm14
        vpsignb 128+256*\g(%rdi), %ymm14, %ymm13        // X * sign(w)
        vpmaddubsw %ymm13, %ymm12, %ymm13
        vpmaddwd Q0_ONES(%rbx), %ymm13, %ymm13
        vpaddd  %ymm13, %ymm\i, %ymm\i
        .endm

        .macro  q8_avx2_blk mt
        each_tok \mt, zero_i
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vpabsb  128+256*\g(%rdi), %ymm12
        each_tok \mt, q8s_tok, \g
        .endr
        flt     \mt
        .endm

        /* q8_0, VNNI: ymm12 = w ^ 0x80 of group \g */
        .macro  q8v_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %ymm14
        {vex} vpdpbusd %ymm14, %ymm12, %ymm\i
        .endm

        .macro  q8_avxvnni_blk mt
        each_tok \mt, corr_i
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        vmovdqa 128+256*\g(%rdi), %ymm12
        vpxor   Q0_K80(%rbx), %ymm12, %ymm12
        each_tok \mt, q8v_tok, \g
        .endr
        flt     \mt
        .endm

        /* q4_0: ymm12 = u of group g, ymm13 = u of group g + 4 */
        .macro  nibbles g
        vmovdqa 128+256*\g(%rdi), %ymm12
        vpsrlw  $4, %ymm12, %ymm13
        vpand   Q0_M0F(%rbx), %ymm12, %ymm12
        vpand   Q0_M0F(%rbx), %ymm13, %ymm13
        .endm

        .macro  q4m_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %ymm14
        vpmaddubsw %ymm14, %ymm12, %ymm15
        vpaddw  %ymm15, %ymm\i, %ymm\i
        vpbroadcastd 32*\t+4*\g+16(%rax), %ymm14
        vpmaddubsw %ymm14, %ymm13, %ymm15
        vpaddw  %ymm15, %ymm\i, %ymm\i
        .endm

        .macro  q4m_fin t, i, f, a
        vpmaddwd Q0_ONES(%rbx), %ymm\i, %ymm\i
        vpbroadcastd MQ_CO+4*\t(%rax), %ymm14
        vpaddd  %ymm14, %ymm\i, %ymm\i
        .endm

        .macro  q4_avx2_blk mt
        each_tok \mt, zero_i
        .irp    g, 0, 1, 2, 3
        nibbles \g
        each_tok \mt, q4m_tok, \g
        .endr
        each_tok \mt, q4m_fin
        flt     \mt
        .endm

        .macro  q4v_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %ymm14
        {vex} vpdpbusd %ymm14, %ymm12, %ymm\i
        vpbroadcastd 32*\t+4*\g+16(%rax), %ymm15
        {vex} vpdpbusd %ymm15, %ymm13, %ymm\i
        .endm

        .macro  q4_avxvnni_blk mt
        each_tok \mt, corr_i
        .irp    g, 0, 1, 2, 3
        nibbles \g
        each_tok \mt, q4v_tok, \g
        .endr
        flt     \mt
        .endm

#include "matmul_q0.h"

/*
 * void gpt2asm_matmul_q8_0_avx2(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd, size_t ldd,
 *                               const float *b, float *y, size_t ldy, size_t n_tokens, size_t n_in,
 *                               size_t tile_begin, size_t tile_end);
 *   for every token t < n_tokens and output o of tiles tile_begin .. tile_end-1: y[t*ldy + o] = the
 *   matvec's y[o] on xq + t*ldq, xd + t*ldd (docs/kernels.md "q8_0 / q4_0").  xq in -127..127 (sign trick).
 */
        .macro  mq_blk mt
        q8_avx2_blk \mt
        .endm
function gpt2asm_matmul_q8_0_avx2
        mm_q0   2176, 7, 8
endfunc
        .purgem mq_blk

/* void gpt2asm_matmul_q8_0_avxvnni(same);  AVX-VNNI. */
        .macro  mq_blk mt
        q8_avxvnni_blk \mt
        .endm
function gpt2asm_matmul_q8_0_avxvnni
        mm_q0   2176, 7, 8
endfunc
        .purgem mq_blk

/* void gpt2asm_matmul_q4_0_avx2(same, the q4_0 records). */
        .macro  mq_blk mt
        q4_avx2_blk \mt
        .endm
function gpt2asm_matmul_q4_0_avx2
        mm_q0   1152, 3, 8
endfunc
        .purgem mq_blk

/* void gpt2asm_matmul_q4_0_avxvnni(same);  AVX-VNNI. */
        .macro  mq_blk mt
        q4_avxvnni_blk \mt
        .endm
function gpt2asm_matmul_q4_0_avxvnni
        mm_q0   1152, 3, 8
endfunc
        .purgem mq_blk
