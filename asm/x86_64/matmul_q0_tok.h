/*
 * asm/x86_64/matmul_q0_tok.h -- the register-block macros of the q8_0 / q4_0 prefill kernels that
 * matmul_q0_avx2.S (ymm) and matmul_q0_avx512.S (zmm) share: one body, the ISA's registers and the few
 * instructions that differ named by the including file.
 *
 * The including file defines (cpp)
 *     VR      the vector register prefix (ymm / zmm)         VPXOR, VZ  the zeroing xor and its prefix
 *     VMOVA   the aligned load (vmovdqa / vmovdqa64)         VPAND      the and (vpand / vpandd)
 *     W0, W1  the weight operands (then dw in W0)            XB         X broadcast (then xd)
 *     PR      products (then t = xd * dw)                    SF         (float)s
 *     K80, M0F  the 0x80 / 0x0f bytes as a memory operand (avx512: an embedded {1to16} broadcast)
 * and the macros
 *     each_tok mt, m, a   \m t, i, f, \a for every token t < mt (int sum register i, fp32 sum register f)
 *     each_st mt, ns, m, a, sel   the same for (sub-tile s, token t) of a pass of ns sub-tiles (ns = 1:
 *                         each_tok; wide passes: MQ_ST's layout; sel >= 0: only sub-tile sel)
 *     q8s_w g             W0 = |w| of group g (the sign trick), and what q8s_tok needs of w's signs
 *     q8s_tok / q8v_tok / q4m_fin / q4v_tok t, i, f, g    the ISA's per-token dot steps
 * and gets mq_zero, mq_store, the blocks q8s_blk (q8_0 sign trick), q8v_blk (q8_0 VNNI), q4m_blk
 * (q4_0 vpmaddubsw), q4v_blk (q4_0 VNNI) and mq_fn (one kernel: mm_q0 of matmul_q0.h over a block); for q6_k
 * (the ISA files' q6m_blk / q6v_blk) q6_hdr, q6_next (a super-record's header), q6_u (one group's 6-bit
 * values), MQ_ST6 (a second int register per (sub-tile, token)) and mq_fn6.
 */
#ifndef GPT2ASM_X86_MATMUL_Q0_TOK_H
#define GPT2ASM_X86_MATMUL_Q0_TOK_H

/* each_tok's token t: the including file's one-line each_tok lists MQ_TOK(t, f) for its tokens */
#define MQ_TOK(t, f)    .if \mt > t; \m t, t, f, \a; .endif
/* each_st's (sub-tile s, token t) of a wide pass (1-2 tokens, MQ_NSW sub-tiles): int sum register i,
   fp32 sum register f; MQ_WO = the sub-tile's byte offset in a group (its scales at MQ_WO / 2) */
#define MQ_ST(s, t, i, f) .if \ns > s && \mt > t && (\sel < 0 || \sel == s); .set MQ_WO, MQ_VL*s; \m t, i, f, \a; .endif
/* the same with a second int register a2 for (s, t) (q6_k VNNI: the half's sum), passed as \m's 4th argument */
#define MQ_ST6(s, t, i, f, a2) .if \ns > s && \mt > t && (\sel < 0 || \sel == s); .set MQ_WO, MQ_VL*s; \m t, i, f, a2; .endif

        .set    MQ_WO, 0
        .set    MQ_G, 0
#ifndef MQ_PFD_W
#  define MQ_PFD_W 0            /* q8_0 whole-record passes: prefetcht0 distance (0: none; the ISA file sets it) */
#endif

        .macro  zero_f t, i, f, a
        VPXOR   %VZ\f, %VZ\f, %VZ\f
        .endm
        .macro  no_init t, i, f, a               // the block's first group writes the sums (q8s_tok, q4m_tok)
        .endm
        .macro  corr_i t, i, f, a
        vpbroadcastd MQ_CO+4*\t(%rax), %VR\i    // s = -c * sum(xq[t] of the block)
        .endm

        .macro  mq_zero mt, ns
        each_st \mt, \ns, zero_f
        .endm

        .macro  st_tok t, i, f, a
        testq   %r15, %r15
        jz      9f
        vaddps  (%r15), %VR\f, %VR\f            // y = acc + b
9:
        vmovups %VR\f, (%r13)
        addq    %r14, %r13
        .endm

        /* a wide pass's store (t < 4): token t's row at r13 + t * r14 (rcx = 3 * r14) */
        .macro  st_wide t, i, f, a
        testq   %r15, %r15
        jz      9f
        vaddps  MQ_WO(%r15), %VR\f, %VR\f      // y = acc + b
9:
        .if \t == 0
        vmovups %VR\f, MQ_WO(%r13)
        .elseif \t == 1
        vmovups %VR\f, MQ_WO(%r13,%r14)
        .elseif \t == 2
        vmovups %VR\f, MQ_WO(%r13,%r14,2)
        .else
        vmovups %VR\f, MQ_WO(%r13,%rcx)
        .endif
        .endm

        .macro  mq_store mt, ns
        .if \ns == 1
        each_tok \mt, st_tok
        .else
        leaq    (%r14,%r14,2), %rcx
        each_st \mt, \ns, st_wide
        .endif
        .endm

        /* per token: acc = fma((float)s, xd * dw, acc); W0 = dw */
        .macro  flt_tok t, i, f, a
        vbroadcastss MQ_XD+4*\t(%rax), XB
        vmulps  W0, XB, PR                      // t = xd * dw
        vcvtdq2ps %VR\i, SF
        vfmadd231ps PR, SF, %VR\f               // acc = fma(s, t, acc)
        .endm

        /* per sub-tile s < ns: W0 = its dw, then the tokens' fp32 steps (in every (token, output)'s
           block order: one block per call) */
        .macro  flt mt, ns
        .irp    s, 0, 1, 2, 3
        .if     \s < \ns
        .set    MQ_WO, MQ_VL*\s
        .if MQ_Q6
        vcvtph2ps MQ_WO/2(%r9), W0              // q6_k: the super-record's d's
        .else
        vcvtph2ps MQ_WO/2(%r12), W0
        .endif
        each_st \mt, \ns, flt_tok, 0, \s
        .endif
        .endr
        .set    MQ_WO, 0
        .endm

        /* one record's \ns sub-tiles (1, or MQ_NSW in a wide pass): s = \init; per group g < \ngrp and
           sub-tile: \wop g (the weight operand, at MQ_WO), \tok per token; then \fin per token (if any)
           and the fp32 step.  The integer sums' order is free; the fp32 step is the contract's. */
        .macro  grp_blk mt, ns, init, ngrp, wop, tok, fin, lines=0
        each_st \mt, \ns, \init
        .if MQ_PFD_W && \lines && \ns * MQ_VL >= 256
        .set    MQ_PFO, 0                       /* a whole-record pass (1-2 tokens): the record's lines */
        .rept   \lines                          /* MQ_PFD_W bytes ahead, one forward stream */
        prefetcht0 MQ_PFO+MQ_PFD_W(%rdi)
        .set    MQ_PFO, MQ_PFO + 64
        .endr
        .endif
        .irp    g, 0, 1, 2, 3, 4, 5, 6, 7
        .if     \g < \ngrp
        .irp    s, 0, 1, 2, 3
        .if     \s < \ns
        .set    MQ_WO, MQ_VL*\s
        \wop    \g
        each_st \mt, \ns, \tok, \g, \s
        .endif
        .endr
        .endif
        .endr
        .ifnb   \fin
        each_st \mt, \ns, \fin
        .endif
        flt     \mt, \ns
        .endm

        /* q8_0, VNNI: W0 = w ^ 0x80 of group \g */
        .macro  q8v_w g
        VMOVA   128+256*\g+MQ_WO(%rdi), W0
        VPXOR   K80, W0, W0                     // w + 128, unsigned
        .endm

        /* q4_0: W0 = u of group g, W1 = u of group g + 4 */
        .macro  nibbles g
        VMOVA   128+256*\g+MQ_WO(%rdi), W0
        vpsrlw  $4, W0, W1
        VPAND   M0F, W0, W0
        VPAND   M0F, W1, W1
        .endm

        .macro  q4m_tok t, i, f, g
        vpbroadcastd 32*\t+4*\g(%rax), XB
        .if \g == 0
        vpmaddubsw XB, W0, %VR\i                // the block's first group starts the sum
        .else
        vpmaddubsw XB, W0, PR
        vpaddw  PR, %VR\i, %VR\i
        .endif
        vpbroadcastd 32*\t+4*\g+16(%rax), XB
        vpmaddubsw XB, W1, PR
        vpaddw  PR, %VR\i, %VR\i
        .endm

        .macro  q8s_blk mt, ns                  // q8_0, sign trick
        grp_blk \mt, \ns, no_init, 8, q8s_w, q8s_tok, , 34
        .endm
        .macro  q8v_blk mt, ns                  // q8_0, VNNI
        grp_blk \mt, \ns, corr_i, 8, q8v_w, q8v_tok, , 34
        .endm
        .macro  q4m_blk mt, ns                  // q4_0, vpmaddubsw
        grp_blk \mt, \ns, no_init, 4, nibbles, q4m_tok, q4m_fin
        .endm
        .macro  q4v_blk mt, ns                  // q4_0, VNNI
        grp_blk \mt, \ns, corr_i, 4, nibbles, q4v_tok
        .endm

        /* the kernel \name: matmul_q0.h's mm_q0 \rec, \csh, \nsub over the block \blk */
        .macro  mq_fn name, blk, rec, csh, nsub
        .macro  mq_blk mt, ns
        \blk    \mt, \ns
        .endm
function \name
        mm_q0   \rec, \csh, \nsub
endfunc
        .purgem mq_blk
        .endm

        /* ---- q6_k (docs/kernels.md "q6_k"): records inside super-records ---- */

        /* at a super-record's first block (r11 = blocks left, nb % 8 == 0) rdi / r12 step over its
           128-byte header (the 64 d's, read through r9 by the fp32 step) */
        .macro  q6_hdr
        testb   $7, %r11b
        jnz     .Lq6h\@
        addq    $128, %rdi
        addq    $128, %r12
.Lq6h\@:
        .endm

        /* after a super-record's last block: r9 to the next one's d's */
        .macro  q6_next
        leal    -1(%r11), %ecx
        testb   $7, %cl
        jnz     .Lq6n\@
        addq    $13440, %r9
.Lq6n\@:
        .endm

        /* \reg = u of group \g (0..63) for the sub-tile at MQ_WO: the low 4 bits from P (group g % 4: low
           nibbles for g < 4, high for g >= 4), 16 * the high 2 bits from H (group g % 2, bits 2 * (g / 2));
           \tmp: a temporary */
        .macro  q6_u g, reg, tmp
        VMOVA   128+256*((\g)%4)+MQ_WO(%rdi), \reg
        .if (\g) >= 4
        vpsrlw  $4, \reg, \reg
        .endif
        VPAND   M0F, \reg, \reg
        VMOVA   1152+256*((\g)%2)+MQ_WO(%rdi), \tmp
        .if (\g) / 2 == 0
        vpsllw  $4, \tmp, \tmp
        .elseif (\g) / 2 == 1
        vpsllw  $2, \tmp, \tmp
        .elseif (\g) / 2 == 3
        vpsrlw  $2, \tmp, \tmp
        .endif
        VPAND   M30, \tmp, \tmp
        VPOR    \tmp, \reg, \reg
        .endm

        /* the kernel \name over a q6_k block macro: mm_q0 with 1664-byte blocks, 1680 tile bytes a block */
        .macro  mq_fn6 name, blk, nsub
        .macro  mq_blk mt, ns
        \blk    \mt, \ns
        .endm
function \name
        mm_q0   1664, 5, \nsub, 1680, 1
endfunc
        .purgem mq_blk
        .endm

#endif
