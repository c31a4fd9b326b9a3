/*
 * asm/x86_64/matmul_q0_avx512.S -- q8_0 / q4_0 prefill (matrix-matrix) kernels, AVX-512 BW and
 * AVX-512 VNNI (zmm); and q6_k's (gpt2asm_matmul_q6_k_avx512vnni, at the end of the file).
 *
 * The sequence of matmul_q0_avx2.S with matmul_q0.h's blocking and matmul_q0_tok.h's body; register block
 * 8 tokens x 16 outputs
 * (one zmm): the 8 int32 block sums in zmm0-7, the 8 fp32 sums in zmm8-15.  Per record and sub-tile,
 * each group's 64 weight bytes are loaded and made into the dot operand once (zmm16; q4_0: nibbles in
 * zmm16 / zmm17), then per token:
 *   q8_0 avx512      k1 = vpmovb2m(w), |w| once; per token X * sign(w) = X with -X where k1 (vpbroadcastd,
 *                    masked vpsubb), s += vpmaddwd(vpmaddubsw(|w|, X * sign(w)), 1)
 *   q8_0 avx512vnni  s += vpdpbusd(w ^ 0x80, X) with X an embedded {1to16} broadcast from the panel:
 *                    one instruction per token and 64 weight bytes; s starts at -128 * sum(xq)
 *   q4_0 avx512      p16 += vpmaddubsw(u_lo, X_g) + vpmaddubsw(u_hi, X_g+4); s = vpmaddwd(p16, 1) - 8 * sum
 *   q4_0 avx512vnni  s += vpdpbusd(u_lo, X_g{1to16}) + vpdpbusd(u_hi, X_g+4{1to16}); s starts at -8 * sum
 * then per token t = xd * dw, acc = fma((float)s, t, acc); y = acc + b.  zmm16-22 are zeroed before
 * returning (vzeroupper does not clear them).  What is measured later: make bench's TTFT.
 *
 * Registers: matmul_q0.h's GPRs; zmm0-7 int sums, zmm8-15 fp32 sums, zmm16-17 weight operands (then dw),
 * zmm18 X / xd, zmm19 products, zmm20 X * sign(w) / (float)s, zmm21 zero, zmm22 int16 ones, k1 signs.
 */
#include "asm.S"
#include "q0_const.h"

#define MQ_TB 8
#define MQ_VL 64
#define MQ_NSW 4                                // sub-tiles of a wide pass (1-2 tokens): the whole record
#define MQ_NSW2 2                               // and of 3-4 tokens (0: none)
/* The q8_0 whole-record passes (1-2 tokens: batched decode at B = 2, and the head), VNNI and sign trick,
 * prefetch the record's 34 lines MQ_PFD_W bytes ahead (prefetcht0): the hardware prefetchers alone kept
 * too few lines in flight. On Zen 5 a B = 2 q8_0 step took 6.4-6.8 ms without it, 4.4-5.1 with it (VNNI;
 * 2-8 KiB alike); sign trick 6.2 -> 4.7-4.9 ms (docs/notes.md "q8_0 at B = 2 on Zen 5"). q4_0's passes
 * gained nothing. */
#ifndef MQ_PFD_W
#  define MQ_PFD_W 4096
#endif
        q0_const q0_mm_avx512, 64

        .macro  mq_consts
        movrel  %rbx, q0_mm_avx512
        vpbroadcastd Q0_ONES(%rbx), %zmm22
        vpxord  %zmm21, %zmm21, %zmm21
        .endm

        .macro  mq_exit
        vclear  vpxord, zmm, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30
        vzeroupper
        ret
        .endm

#define VR      zmm
#define VZ      zmm
#define VPXOR   vpxord
#define VMOVA   vmovdqa64
#define VPAND   vpandd
#define W0      %zmm16
#define W1      %zmm17
#define XB      %zmm18
#define PR      %zmm19
#define SF      %zmm20
#define K80     Q0_K80(%rbx){1to16}
#define M0F     Q0_M0F(%rbx){1to16}
#define M30     Q0_M30(%rbx){1to16}
#define VPOR    vpord
#include "matmul_q0_tok.h"

        .macro  each_tok mt, m, a=0
        MQ_TOK(0, 8); MQ_TOK(1, 9); MQ_TOK(2, 10); MQ_TOK(3, 11)
        MQ_TOK(4, 12); MQ_TOK(5, 13); MQ_TOK(6, 14); MQ_TOK(7, 15)
        .endm

        /* \m for (sub-tile s, token t) of \ns sub-tiles (only s = \sel if \sel >= 0): a wide pass keeps
           (s, t)'s sums in zmm(8 / ns * s + t) / zmm(8 + 8 / ns * s + t): \ns = 4 for 1-2 tokens (the
           whole record), \ns = 2 for 3-4 tokens (128 bytes a group) */
        .macro  each_st mt, ns, m, a=0, sel=-1
        .if \ns == 1
        each_tok \mt, \m, \a
        .elseif \ns == 2
        MQ_ST(0, 0, 0, 8); MQ_ST(0, 1, 1, 9); MQ_ST(0, 2, 2, 10); MQ_ST(0, 3, 3, 11)
        MQ_ST(1, 0, 4, 12); MQ_ST(1, 1, 5, 13); MQ_ST(1, 2, 6, 14); MQ_ST(1, 3, 7, 15)
        .else
        MQ_ST(0, 0, 0, 8); MQ_ST(0, 1, 1, 9); MQ_ST(1, 0, 2, 10); MQ_ST(1, 1, 3, 11)
        MQ_ST(2, 0, 4, 12); MQ_ST(2, 1, 5, 13); MQ_ST(3, 0, 6, 14); MQ_ST(3, 1, 7, 15)
        .endif
        .endm

        /* q8_0 sign trick: zmm16 = |w|, k1 = w < 0; per token X * sign(w) = X with -X where k1 */
        .macro  q8s_w g
        vmovdqa64 128+256*\g+MQ_WO(%rdi), %zmm16
        vpmovb2m %zmm16, %k1
        vpabsb  %zmm16, %zmm16
        .endm
        .macro  q8s_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), %zmm20
        vpsubb  %zmm20, %zmm21, %zmm20{%k1}     // X * sign(w)
        vpmaddubsw %zmm20, %zmm16, %zmm19
        .if \g == 0
        vpmaddwd %zmm22, %zmm19, %zmm\i        // the block's first group starts the sum
        .else
        vpmaddwd %zmm22, %zmm19, %zmm19
        vpaddd  %zmm19, %zmm\i, %zmm\i
        .endif
        .endm

        /* q8_0, VNNI: X an embedded broadcast from the panel */
        .macro  q8v_tok t, i, f, g
        vpdpbusd 32*\t+4*\g(%rax){1to16}, %zmm16, %zmm\i
        .endm

        /* q4_0: s = vpmaddwd(p16, 1) - 8 * sum(xq) */
        .macro  q4m_fin t, i, f, a
        vpmaddwd %zmm22, %zmm\i, %zmm\i
        vpaddd  MQ_CO+4*\t(%rax){1to16}, %zmm\i, %zmm\i
        .endm

        .macro  q4v_tok t, i, f, g
        vpdpbusd 32*\t+4*\g(%rax){1to16}, %zmm16, %zmm\i
        vpdpbusd 32*\t+4*\g+16(%rax){1to16}, %zmm17, %zmm\i
        .endm

#include "matmul_q0.h"

/*
 * q6_k VNNI (docs/kernels.md "gpt2asm_{matvec,matmul}_q6_k_<isa>"): per record (block b) and sub-tile of
 * 16 outputs, sc[2b] and sc[2b+1] widened to int32 (vpmovsxbd) into the scratch (MQ_SCR + 128 s); then per
 * half h, per token: A = -32 * sum(xq of the half) (the panel), A += vpdpbusd(u_g, X_g{1to16}) over the
 * half's 4 groups (u = the 6-bit values 0..63, made once per token block: q6_u), so A = S_h exactly;
 * s = sc0 * A (h = 0), s += sc1 * A (h = 1) (vpmulld); then the fp32 step with d from the super-record's
 * header (r9).  A of (sub-tile s, token t): zmm23-30 (each_st6), next to int sum zmm(i) and fp32 sum
 * zmm(8 + i).  The whole-record pass (1-2 tokens: batched decode over the head from DRAM) prefetches each
 * record's 26 lines MQ6_PFD = 6144 bytes ahead (prefetcht0): the head at 1 / 2 tokens went from 0.71 / 0.75
 * to 0.86 / 0.82-0.87 of a plain read (Zen 5; 3072: no gain, 12288: about the same); so do the 2-sub-tile
 * passes (3-4 tokens, MQ6_PF2: 0.76 / 0.72 -> 0.80 / 0.75, the second pass's prefetches mostly redundant).
 */
        .macro  each_st6 mt, ns, m, sel=-1
        .if \ns == 1
        MQ_ST6(0, 0, 0, 8, 23); MQ_ST6(0, 1, 1, 9, 24); MQ_ST6(0, 2, 2, 10, 25); MQ_ST6(0, 3, 3, 11, 26)
        MQ_ST6(0, 4, 4, 12, 27); MQ_ST6(0, 5, 5, 13, 28); MQ_ST6(0, 6, 6, 14, 29); MQ_ST6(0, 7, 7, 15, 30)
        .elseif \ns == 2
        MQ_ST6(0, 0, 0, 8, 23); MQ_ST6(0, 1, 1, 9, 24); MQ_ST6(0, 2, 2, 10, 25); MQ_ST6(0, 3, 3, 11, 26)
        MQ_ST6(1, 0, 4, 12, 27); MQ_ST6(1, 1, 5, 13, 28); MQ_ST6(1, 2, 6, 14, 29); MQ_ST6(1, 3, 7, 15, 30)
        .else
        MQ_ST6(0, 0, 0, 8, 23); MQ_ST6(0, 1, 1, 9, 24); MQ_ST6(1, 0, 2, 10, 25); MQ_ST6(1, 1, 3, 11, 26)
        MQ_ST6(2, 0, 4, 12, 27); MQ_ST6(2, 1, 5, 13, 28); MQ_ST6(3, 0, 6, 14, 29); MQ_ST6(3, 1, 7, 15, 30)
        .endif
        .endm

        .macro  q6v_init0 t, i, f, a
        vpbroadcastd MQ_CO+4*\t(%rax), %zmm\a   // -32 * sum(xq of inputs 0-15)
        .endm
        .macro  q6v_init1 t, i, f, a
        vpbroadcastd MQ_C1+4*\t(%rax), %zmm\a   // of inputs 16-31
        .endm
        .macro  q6v_tok t, i, f, a
        vpdpbusd 32*\t+4*MQ_G(%rax){1to16}, %zmm16, %zmm\a
        .endm
        .macro  q6v_fold0 t, i, f, a
        vpmulld MQ_SCR+2*MQ_WO(%rsp), %zmm\a, %zmm\i       // s = sc0 * S0
        .endm
        .macro  q6v_fold1 t, i, f, a
        vpmulld MQ_SCR+2*MQ_WO+64(%rsp), %zmm\a, %zmm\a
        vpaddd  %zmm\a, %zmm\i, %zmm\i                     // s += sc1 * S1
        .endm

#ifndef MQ6_PFD
#define MQ6_PFD 6144                            /* whole-record passes: prefetcht0 distance (0: none) */
#endif
        .macro  q6v_blk mt, ns
        q6_hdr
#ifndef MQ6_PF2
#define MQ6_PF2 1                               /* the 2-sub-tile passes (3-4 tokens) too */
#endif
        .if (\ns == 4 || (\ns == 2 && MQ6_PF2)) && MQ6_PFD
        .set    MQ6_O, 0
        .rept   26
        prefetcht0 MQ6_O+MQ6_PFD(%rdi)         // one forward stream, ahead of the out-of-order window
        .set    MQ6_O, MQ6_O + 64
        .endr
        .endif
        .irp    s, 0, 1, 2, 3
        .if     \s < \ns
        .set    MQ_WO, MQ_VL*\s
        vpmovsxbd MQ_WO/4(%r12), %zmm19
        vmovdqa64 %zmm19, MQ_SCR+2*MQ_WO(%rsp)
        vpmovsxbd 64+MQ_WO/4(%r12), %zmm19
        vmovdqa64 %zmm19, MQ_SCR+2*MQ_WO+64(%rsp)
        .endif
        .endr
        .irp    h, 0, 1
        each_st6 \mt, \ns, q6v_init\h
        .irp    g4, 0, 1, 2, 3
        .irp    s, 0, 1, 2, 3
        .if     \s < \ns
        .set    MQ_WO, MQ_VL*\s
        q6_u    4*\h+\g4, %zmm16, %zmm19
        .set    MQ_G, 4*\h+\g4
        each_st6 \mt, \ns, q6v_tok, \s
        .endif
        .endr
        .endr
        each_st6 \mt, \ns, q6v_fold\h
        .endr
        .set    MQ_WO, 0
        flt     \mt, \ns
        q6_next
        .endm

/*
 * void gpt2asm_matmul_q8_0_avx512(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd,
 *                                 size_t ldd, const float *b, float *y, size_t ldy, size_t n_tokens,
 *                                 size_t n_in, size_t tile_begin, size_t tile_end);
 *   as gpt2asm_matmul_q8_0_avx2 (the same bits); xq in -127..127.  AVX512F + BW.
 */
        mq_fn   gpt2asm_matmul_q8_0_avx512, q8s_blk, 2176, 7, 4

/* void gpt2asm_matmul_q8_0_avx512vnni(same);  AVX512F + BW + VNNI. */
        mq_fn   gpt2asm_matmul_q8_0_avx512vnni, q8v_blk, 2176, 7, 4

/* void gpt2asm_matmul_q4_0_avx512(same, the q4_0 records);  AVX512F + BW. */
        mq_fn   gpt2asm_matmul_q4_0_avx512, q4m_blk, 1152, 3, 4

/* void gpt2asm_matmul_q4_0_avx512vnni(same);  AVX512F + BW + VNNI. */
        mq_fn   gpt2asm_matmul_q4_0_avx512vnni, q4v_blk, 1152, 3, 4

/*
 * void gpt2asm_matmul_q6_k_avx512vnni(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd,
 *                                     size_t ldd, const float *b, float *y, size_t ldy, size_t n_tokens,
 *                                     size_t n_in, size_t tile_begin, size_t tile_end);
 *   as gpt2asm_matmul_q6_k_avx2 (the same bits: per block S_h exact, s = sc0 * S0 + sc1 * S1,
 *   t = xd[b] * d[b/8], acc = fma((float)s, t, acc); y = acc + bias).  Any int8 xq.  AVX512F + BW + VNNI.
 */
        mq_fn6  gpt2asm_matmul_q6_k_avx512vnni, q6v_blk, 4
