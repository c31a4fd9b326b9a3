/*
 * asm/x86_64/matmul_q0_avx2.S -- q8_0 / q4_0 prefill (matrix-matrix) kernels, AVX2 and AVX-VNNI (ymm);
 * and q6_k's (gpt2asm_matmul_q6_k_avx2; its decode kernel is matvec_q0_avx2.S's).
 *
 * docs/kernels.md "q8_0 / q4_0"; the blocking and the activation panel are matmul_q0.h's, the register-block
 * body matmul_q0_tok.h's (this file names its registers and ISA steps).  Register block: 6 tokens
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
#define MQ_NSW 2                                // sub-tiles of a wide pass (1-3 tokens): 64 bytes a group
#define MQ_NSW2 0                               // no second wide pass
        q0_const q0_mm_avx2, 32

        .macro  mq_consts
        movrel  %rbx, q0_mm_avx2
        .endm

        .macro  mq_exit
        vzeroupper
        ret
        .endm

#define VR      ymm
#define VZ      xmm
#define VPXOR   vpxor
#define VMOVA   vmovdqa
#define VPAND   vpand
#define W0      %ymm12
#define W1      %ymm13
#define XB      %ymm14
#define PR      %ymm15
#define SF      %ymm13
#define K80     Q0_K80(%rbx)
#define M0F     Q0_M0F(%rbx)
#define M30     Q0_M30(%rbx)
#define VPOR    vpor
#include "matmul_q0_tok.h"

        .macro  each_tok mt, m, a=0
        MQ_TOK(0, 6); MQ_TOK(1, 7); MQ_TOK(2, 8); MQ_TOK(3, 9); MQ_TOK(4, 10); MQ_TOK(5, 11)
        .endm

        /* \m for (sub-tile s, token t) of \ns sub-tiles (only s = \sel if \sel >= 0): a wide pass (\ns = 2,
           \mt <= 3) keeps (s, t)'s sums in ymm(3s + t) / ymm(6 + 3s + t) */
        .macro  each_st mt, ns, m, a=0, sel=-1
        .if \ns == 1
        each_tok \mt, \m, \a
        .else
        MQ_ST(0, 0, 0, 6); MQ_ST(0, 1, 1, 7); MQ_ST(0, 2, 2, 8)
        MQ_ST(1, 0, 3, 9); MQ_ST(1, 1, 4, 10); MQ_ST(1, 2, 5, 11)
        .endif
        .endm

        /* q8_0, sign trick: ymm12 = |w| of group \g; per token X * sign(w) by vpsignb */
        .macro  q8s_w g
        vpabsb  128+256*\g+MQ_WO(%rdi), %ymm12
        .endm
        .macro  q8s_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %ymm14
        vpsignb 128+256*\g+MQ_WO(%rdi), %ymm14, %ymm13       // X * sign(w)
        vpmaddubsw %ymm13, %ymm12, %ymm13
        .if \g == 0
        vpmaddwd Q0_ONES(%rbx), %ymm13, %ymm\i  // the block's first group starts the sum
        .else
        vpmaddwd Q0_ONES(%rbx), %ymm13, %ymm13
        vpaddd  %ymm13, %ymm\i, %ymm\i
        .endif
        .endm

        /* q8_0, VNNI: ymm12 = w ^ 0x80 of group \g */
        .macro  q8v_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %ymm14
        {vex} vpdpbusd %ymm14, %ymm12, %ymm\i
        .endm

        /* q4_0: s = vpmaddwd(p16, 1) - 8 * sum(xq) */
        .macro  q4m_fin t, i, f, a
        vpmaddwd Q0_ONES(%rbx), %ymm\i, %ymm\i
        vpbroadcastd MQ_CO+4*\t(%rax), %ymm14
        vpaddd  %ymm14, %ymm\i, %ymm\i
        .endm

        .macro  q4v_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %ymm14
        {vex} vpdpbusd %ymm14, %ymm12, %ymm\i
        vpbroadcastd 32*\t+4*\g+16(%rax), %ymm15
        {vex} vpdpbusd %ymm15, %ymm13, %ymm\i
        .endm

#include "matmul_q0.h"

/*
 * q6_k (docs/kernels.md "gpt2asm_{matvec,matmul}_q6_k_<isa>"): per record (block b) and sub-tile of 8
 * outputs, the sub-scales first: S_h = sc[2b+h] as int16 pairs (both words of output j's dword: vpmovsxbd,
 * vpshufb), and SW = the pair (sc0, sc1) (vpblendw), into the scratch (MQ_SCR + 96 s); then per token
 *     s  = 32 * vpmaddwd(SW, (-sum(xq of 0-15), -sum(xq of 16-31)))     (exact: |.| <= 2 * 128 * 2048)
 * and per pair of groups (g, g+1) of half h, u = the 6-bit values (0..63, made once per token block: q6_u)
 *     s += vpmaddwd(vpmaddubsw(u_g, X_g) + vpmaddubsw(u_g+1, X_g+1), S_h)
 * (int16 pair sums <= 2 * 63 * 128 each, two of them <= 32256: no saturation), so s = sc0 * S0 + sc1 * S1
 * exactly; then the fp32 step with d widened from the super-record's header (r9).
 */
        .macro  q6m_init t, i, f, a
        vpbroadcastd MQ_CW+4*\t(%rax), %ymm14
        vpmaddwd MQ_SCR+3*MQ_WO+64(%rsp), %ymm14, %ymm\i
        vpslld  $5, %ymm\i, %ymm\i              // -32 * (sc0 * sum0 + sc1 * sum1)
        .endm

        .macro  q6m_tok t, i, f, a
        vpbroadcastd 32*\t+4*MQ_G(%rax), %ymm14
        vpmaddubsw %ymm14, %ymm12, %ymm15
        vpbroadcastd 32*\t+4*MQ_G+4(%rax), %ymm14
        vpmaddubsw %ymm14, %ymm13, %ymm14
        vpaddw  %ymm14, %ymm15, %ymm15
        vpmaddwd MQ_SCR+3*MQ_WO+32*(MQ_G/4)(%rsp), %ymm15, %ymm15    // * sc of the half
        vpaddd  %ymm15, %ymm\i, %ymm\i
        .endm

        .macro  q6m_blk mt, ns
        q6_hdr
        .irp    s, 0, 1
        .if     \s < \ns
        .set    MQ_WO, MQ_VL*\s
        vpmovsxbd MQ_WO/4(%r12), %ymm12
        vpshufb Q0_DUPW(%rbx), %ymm12, %ymm12   // sc0 in both words of each dword
        vpmovsxbd 64+MQ_WO/4(%r12), %ymm13
        vpshufb Q0_DUPW(%rbx), %ymm13, %ymm13
        vmovdqa %ymm12, MQ_SCR+3*MQ_WO(%rsp)
        vmovdqa %ymm13, MQ_SCR+3*MQ_WO+32(%rsp)
        vpblendw $0xaa, %ymm13, %ymm12, %ymm12  // (sc0, sc1)
        vmovdqa %ymm12, MQ_SCR+3*MQ_WO+64(%rsp)
        .endif
        .endr
        each_st \mt, \ns, q6m_init
        .irp    pp, 0, 1, 2, 3
        .irp    s, 0, 1
        .if     \s < \ns
        .set    MQ_WO, MQ_VL*\s
        q6_u    2*\pp, %ymm12, %ymm15
        q6_u    2*\pp+1, %ymm13, %ymm15
        .set    MQ_G, 2*\pp
        each_st \mt, \ns, q6m_tok, 0, \s
        .endif
        .endr
        .endr
        .set    MQ_WO, 0
        flt     \mt, \ns
        q6_next
        .endm

/*
 * void gpt2asm_matmul_q8_0_avx2(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd, size_t ldd,
 *                               const float *b, float *y, size_t ldy, size_t n_tokens, size_t n_in,
 *                               size_t tile_begin, size_t tile_end);
 *   for every token t < n_tokens and output o of tiles tile_begin .. tile_end-1: y[t*ldy + o] = the
 *   matvec's y[o] on xq + t*ldq, xd + t*ldd (docs/kernels.md "q8_0 / q4_0").  xq in -127..127 (sign trick).
 */
        mq_fn   gpt2asm_matmul_q8_0_avx2, q8s_blk, 2176, 7, 8

/* void gpt2asm_matmul_q8_0_avxvnni(same);  AVX-VNNI. */
        mq_fn   gpt2asm_matmul_q8_0_avxvnni, q8v_blk, 2176, 7, 8

/* void gpt2asm_matmul_q4_0_avx2(same, the q4_0 records). */
        mq_fn   gpt2asm_matmul_q4_0_avx2, q4m_blk, 1152, 3, 8

/* void gpt2asm_matmul_q4_0_avxvnni(same);  AVX-VNNI. */
        mq_fn   gpt2asm_matmul_q4_0_avxvnni, q4v_blk, 1152, 3, 8

/*
 * void gpt2asm_matmul_q6_k_avx2(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd, size_t ldd,
 *                               const float *b, float *y, size_t ldy, size_t n_tokens, size_t n_in,
 *                               size_t tile_begin, size_t tile_end);
 *   for every token t < n_tokens and output o of tiles tile_begin .. tile_end-1: y[t*ldy + o] = the q6_k
 *   matvec's y[o] on xq + t*ldq, xd + t*ldd:  per block b: S_h = sum over half h of q * xq (exact),
 *   s = sc[2b] * S0 + sc[2b+1] * S1, t = xd[b] * d[b/8], acc = fma((float)s, t, acc); y = acc + bias.
 *   n_in % 256 == 0; the q6_k tiled super-records (13440 bytes per 256 inputs and tile), 64-byte aligned.
 *   Any int8 xq.  AVX2 + FMA + F16C.
 */
        mq_fn6  gpt2asm_matmul_q6_k_avx2, q6m_blk, 8
