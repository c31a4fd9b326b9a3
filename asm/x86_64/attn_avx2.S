/*
 * asm/x86_64/attn_avx2.S -- single-query causal self-attention over the KV cache, AVX2 + FMA.
 *
 * The heads of a call go in groups of ATT_GROUP (4) heads, interleaved position by position within a
 * group, while a head's rows are short (n_pos * element size * 64 <= ATT_SHORT = 64 KiB, e.g. binary16
 * up to position 512): the cache comes from DRAM (the weights stream evicts it between layers), and
 * one short forward stream after another leaves the memory system idle while each one starts; four
 * side by side keep it busy.  Measured on Zen 4 (scratch, the 12 heads of one layer after a 20 MB
 * read): 1.15-1.9x faster than head by head at positions 100-200, no better at 400-800, and worse
 * with all 12 heads interleaved (more streams than the prefetchers follow).  Longer rows: groups of 1.
 *   scores: for each group of 4 positions, for each head of the group: q_h into ymm8-15, then per
 *           position two ymm partial sums = the 16 lanes of dot64, the hsum16 trees of the 4 positions
 *           transposed into one xmm, into the head's scratch row;
 *   softmax of each head's row (the macro of gpt2asm_softmax_f32_avx2);
 *   p.V:    for each group of 4 positions, for each head of the group: its 64 outputs (kept in out
 *           between position groups) into 8 ymm accumulators, one broadcast of p_t and 8 FMAs per
 *           position, back to out.
 * Each output is still one FMA chain over t = 0, 1, ... (storing and reloading it changes nothing), so
 * the grouping changes no bit.  The same code serves a float32 cache and a binary16 one
 * (gpt2asm_attention_f16_avx2: each row widened exactly with vcvtph2ps).
 */
#include "asm.S"
#include "math_avx2.h"

/*
 * kvrow es, op, off, d, p, acc, tmp
 *   acc = fma(\op, row[8 elements from element \off of the row at \d(\p)], acc): with es = 4 (a float32
 *   cache) the row is the FMA's memory operand; with es = 2 (binary16) it is widened exactly first
 *   (vcvtph2ps into ymm\tmp), so both compute the same float32 operations on the same values.
 */
        .macro  kvrow es, op, off, d, p, acc, tmp
        .if \es == 4
        vfmadd231ps \d+\off*4(\p), \op, \acc
        .else
        vcvtph2ps   \d+\off*2(\p), %ymm\tmp
        vfmadd231ps %ymm\tmp, \op, \acc
        .endif
        .endm

/*
 * pvrow es, p, d
 *   o = fma(p, v_t, o) for the 64 outputs o in ymm0-7 and the row v_t of 64 elements at \d(%rax);
 *   \p holds p_t broadcast.  Clobbers ymm10-15 (es = 2).
 */
        .macro  pvrow es, p, d
        kvrow       \es, \p,  0, \d, %rax, %ymm0, 10
        kvrow       \es, \p,  8, \d, %rax, %ymm1, 11
        kvrow       \es, \p, 16, \d, %rax, %ymm2, 12
        kvrow       \es, \p, 24, \d, %rax, %ymm3, 13
        kvrow       \es, \p, 32, \d, %rax, %ymm4, 14
        kvrow       \es, \p, 40, \d, %rax, %ymm5, 15
        kvrow       \es, \p, 48, \d, %rax, %ymm6, 10
        kvrow       \es, \p, 56, \d, %rax, %ymm7, 11
        .endm

/*
 * dotpos_avx2 es, r, p, d
 *   xmm\r = lanes s[0..3] of dot64(q, row) after the w = 8 and w = 4 steps of the hsum16 tree, for the
 *   row of 64 elements (es bytes each) at \d(\p); q is in ymm8-15 (q[0:8], q[8:16], ..., q[56:64]).
 *     acc[j] = +0.0;  acc[j] = fma(q[16c+j], row[16c+j], acc[j]) for c = 0..3   (ymm4: j < 8, ymm5)
 *   Clobbers ymm4-7.
 */
        .macro  dotpos_avx2 es, r, p, d
        vxorps      %ymm4, %ymm4, %ymm4
        vxorps      %ymm5, %ymm5, %ymm5
        kvrow       \es, %ymm8,   0, \d, \p, %ymm4, 6     // c = 0, lanes 0-7
        kvrow       \es, %ymm9,   8, \d, \p, %ymm5, 7     // c = 0, lanes 8-15
        kvrow       \es, %ymm10, 16, \d, \p, %ymm4, 6     // c = 1
        kvrow       \es, %ymm11, 24, \d, \p, %ymm5, 7
        kvrow       \es, %ymm12, 32, \d, \p, %ymm4, 6     // c = 2
        kvrow       \es, %ymm13, 40, \d, \p, %ymm5, 7
        kvrow       \es, %ymm14, 48, \d, \p, %ymm4, 6     // c = 3
        kvrow       \es, %ymm15, 56, \d, \p, %ymm5, 7
        vaddps      %ymm5, %ymm4, %ymm4             // w = 8
        vextractf128 $1, %ymm4, %xmm5
        vaddps      %xmm5, %xmm4, %xmm\r            // w = 4
        .endm

/*
 * dot4_avx2 es, p0, d0, p1, d1, p2, d2, p3, d3
 *   xmm0 = { dot64(q, row_i) * 0.125f : i = 0..3 } for the rows at \di(\pi).  Clobbers ymm0-7.
 */
        .macro  dot4_avx2 es, p0, d0, p1, d1, p2, d2, p3, d3
        dotpos_avx2 \es, 0, \p0, \d0
        dotpos_avx2 \es, 1, \p1, \d1
        dotpos_avx2 \es, 2, \p2, \d2
        dotpos_avx2 \es, 3, \p3, \d3
        tree4_avx2
        .endm

/*
 * tree4_avx2
 *   xmm0 = { (a_i[0] + a_i[2]) + (a_i[1] + a_i[3]) : i = 0..3 } * 0.125f for the 4 partial sums a_i in
 *   xmm0-3 (the w = 2 and w = 1 steps of the hsum16 tree of 4 dot products, then the scale; r11 =
 *   math_avx2).  Clobbers xmm2, xmm4, xmm5.
 */
        .macro  tree4_avx2
        vshufps     $0x44, %xmm1, %xmm0, %xmm4      // r0[0] r0[1] r1[0] r1[1]
        vshufps     $0xEE, %xmm1, %xmm0, %xmm5      // r0[2] r0[3] r1[2] r1[3]
        vaddps      %xmm5, %xmm4, %xmm0             // w = 2 (positions 0, 1)
        vshufps     $0x44, %xmm3, %xmm2, %xmm4
        vshufps     $0xEE, %xmm3, %xmm2, %xmm5
        vaddps      %xmm5, %xmm4, %xmm2             // w = 2 (positions 2, 3)
        vshufps     $0x88, %xmm2, %xmm0, %xmm4      // s[0] of positions 0..3
        vshufps     $0xDD, %xmm2, %xmm0, %xmm5      // s[1] of positions 0..3
        vaddps      %xmm5, %xmm4, %xmm0             // w = 1
        vmulps      KV_EIGHTH(%r11), %xmm0, %xmm0   // * 0.125
        .endm

/*
 * void gpt2asm_attention_f32_avx2(const float *q, const float *k, const float *v, float *out,
 *                                 float *scratch, size_t n_pos, size_t head_stride,
 *                                 size_t head_begin, size_t head_end);
 * void gpt2asm_attention_f16_avx2(const float *q, const uint16_t *k, const uint16_t *v, float *out,
 *                                 float *scratch, size_t n_pos, size_t head_stride,
 *                                 size_t head_begin, size_t head_end);     (binary16 cache, F16C)
 *
 *   for h in [head_begin, head_end):   (the f16 kernel: the same operations on the cache rows widened
 *                                       exactly to float32; head_stride counts elements in both)
 *     s_t    = dot64(q_h, k_h[t]) * 0.125f                 t < n_pos   (k_h = k + h*head_stride)
 *     p      = softmax(s)                                  (in scratch row h - head_begin)
 *     out_h  = sum_t p_t v_h[t]   (o = +0.0; o = fma(p_t, v_h[t], o) for t = 0, 1, ...)
 *   scratch: (head_end - head_begin) rows of S = roundup16(n_pos) floats; n_pos >= 1.
 */
#define A_LOC       88                              /* locals below the six saved registers */
#define L_OUT        0                              /* out + 64 head_begin                  */
#define L_N4         8                              /* n_pos rounded down to 4              */
#define L_O1        16                              /* tail group: byte offsets of rows 1, 2 */
#define L_O2        24
#define L_CNT       32                              /* tail loops: heads left               */
#define L_LEFT      40                              /* heads after this group               */
#define L_G         48                              /* heads per group                      */
#define L_DK        56                              /* prefetch: k_h[t] -> V_h[t + PFN - n_pos] */
#define L_DV        64                              /* prefetch: v_h[t] -> K_h+G[t + PFN - n_pos] */
#define L_PFB       72                              /* prefetch: 64 es PFN, 0 = no prefetch   */
#ifndef ATT_GROUP
#define ATT_GROUP   4
#endif
#ifndef ATT_SHORT
#define ATT_SHORT   65536
#endif
/*
 * Software prefetch of the cache rows (ATT_PF = 1; -DATT_PF=0 builds without it), while the heads are
 * interleaved (groups of G > 1) and a head's rows are at most ATT_PFMAX (32 KiB) bytes (binary16: n_pos
 * <= 256, float32: <= 128): each head's rows are read as one logical stream, K_h then V_h then K_h+G
 * (the same head of the next group), and every group of 4 positions of a head first prefetches
 * (ATT_PFOP) the 4 rows ATT_PFN (16) positions further along that stream: in the scores k_h[t + PFN]
 * while t + PFN < n_pos, else v_h[t + PFN - n_pos]; in p.V v_h[t + PFN], else k_h+G[t + PFN - n_pos]
 * (nothing for the last group, or when the next group has fewer heads).  On entry the first PFN rows of
 * the first group's K.  The last 1..3 positions (tail groups) prefetch nothing.  Prefetches are hints:
 * they never fault and change no result.  Measured on Zen 4 (docs/notes.md): the batched decode's
 * binary16 BATTN 10-25 % faster at positions 100-200; with groups of 1 or longer rows no better or
 * slower (the hardware prefetchers follow those), hence the limits.
 */
#ifndef ATT_PF
#define ATT_PF      1
#endif
#ifndef ATT_PFN
#define ATT_PFN     16
#endif
#ifndef ATT_PFOP
#define ATT_PFOP    prefetcht2
#endif
#ifndef ATT_PFMAX
#define ATT_PFMAX   32768
#endif

/* pflines p, i, n: ATT_PFOP of the n lines from (\p,\i), or from (\p) with i blank */
        .macro  pflines p, i, n
        .set        pf_off, 0
        .rept       \n
        .ifb \i
        ATT_PFOP    pf_off(\p)
        .else
        ATT_PFOP    pf_off(\p,\i)
        .endif
        .set        pf_off, pf_off + 64
        .endr
        .endm

/* pfrows p, i, n: pflines p, i, n unless i (the prefetch offset) is 0 */
        .macro  pfrows p, i, n
        testq       \i, \i
        jz          .Lnopf\@
        pflines     \p, \i, \n
.Lnopf\@:
        .endm

#define A_STRIDE    (A_LOC + 56)                    /* stack arguments                      */
#define A_BEGIN     (A_LOC + 64)
#define A_END       (A_LOC + 72)

/*
 * ldrow es, p, off, r, rs...  /  st64 p, off, r, rs...
 *   ymm\r, ymm\rs... = 8 elements each (es bytes: float32, or binary16 widened exactly by vcvtph2ps)
 *   from \off(\p), \off+8 es(\p), ...  /  float32 registers to \off(\p), \off+32(\p), ... (one
 *   register may repeat: st64 with 0,0,0,0,0,0,0,0 zeroes 64 floats from a zeroed ymm0).
 */
        .macro  ldrow es, p, off, r, rs:vararg
        .if \es == 4
        vmovups     \off(\p), %ymm\r
        .else
        vcvtph2ps   \off(\p), %ymm\r
        .endif
        .ifnb \rs
        ldrow       \es, \p, \off+8*\es, \rs
        .endif
        .endm

        .macro  st64 p, off, r, rs:vararg
        vmovups     %ymm\r, \off(\p)
        .ifnb \rs
        st64        \p, \off+32, \rs
        .endif
        .endm

/*
 * pvgroup es, n
 *   o = fma(p_t, v_t, o) for the n = 4 or 1 positions of a group, for one head: the outputs at (%rcx)
 *   into ymm0-7 and back, p_t from (%rbx), the rows from (%rax).  Clobbers ymm0-15.
 */
        .macro  pvgroup es, n
        ldrow       4, %rcx, 0, 0, 1, 2, 3, 4, 5, 6, 7
        vbroadcastss  0(%rbx), %ymm8                // p_t
        .if \n == 4
        vbroadcastss  4(%rbx), %ymm9                // p_t+1
        pvrow       \es, %ymm8, 0                   // o = fma(p_t, v_t, o)
        pvrow       \es, %ymm9, 64*\es
        vbroadcastss  8(%rbx), %ymm8
        vbroadcastss 12(%rbx), %ymm9
        pvrow       \es, %ymm8, 128*\es
        pvrow       \es, %ymm9, 192*\es
        .else
        pvrow       \es, %ymm8, 0
        .endif
        st64        %rcx, 0, 0, 1, 2, 3, 4, 5, 6, 7
        .endm

/*
 * score_heads es, tail
 *   For each head of the group (r13 of them): q_h into ymm8-15 and the scores of the 4 rows from
 *   position t = rax into its scratch row.  tail = 0: rows t .. t+3; tail = 1: rows t, t+L_O1, t+L_O2,
 *   t+L_O2 (byte offsets: the last 1..3 rows, the missing ones repeating the last).
 */
        .macro  score_heads es, tail
        movq        %rax, %r15
        shlq        $(6 + \es/2), %r15
        addq        %rsi, %r15                      // k_h0[t]
        movq        %rdi, %rbp                      // q_h0
        leaq        (%r8,%rax,4), %rbx              // scratch row 0, column t
        .if \tail
        movq        %r13, L_CNT(%rsp)               // (r10 and rcx hold rows 1, 2)
        .else
        movq        %r13, %r10
#if ATT_PF
        leaq        ATT_PFN(%rax), %rcx             // prefetch offset from k_h[t]: 64 es PFN, or
        cmpq        %r9, %rcx                       // into V_h once t + PFN >= n_pos (0: none)
        movq        L_PFB(%rsp), %rcx
        cmovaeq     L_DK(%rsp), %rcx
#endif
        .endif
.Lsc\@:
        .if \tail == 0
#if ATT_PF
        pfrows      %r15, %rcx, (4*\es)             // the 4 rows PFN positions on
#endif
        .endif
        ldrow       4, %rbp, 0, 8, 9, 10, 11, 12, 13, 14, 15
        .if \tail
        movq        L_O1(%rsp), %r10
        addq        %r15, %r10
        movq        L_O2(%rsp), %rcx
        addq        %r15, %rcx
        dot4_avx2   \es, %r15, 0, %r10, 0, %rcx, 0, %rcx, 0
        .else
        dot4_avx2   \es, %r15, 0, %r15, 64*\es, %r15, 128*\es, %r15, 192*\es
        .endif
        vmovups     %xmm0, (%rbx)
        addq        %r12, %r15
        addq        $256, %rbp
        addq        %r14, %rbx
        .if \tail
        decq        L_CNT(%rsp)
        .else
        decq        %r10
        .endif
        jnz         .Lsc\@
        .endm

/*
 * pv_heads es, n
 *   For each head of the group: pvgroup of the n positions from t = r15.
 */
        .macro  pv_heads es, n
        movq        %r15, %rax
        shlq        $(6 + \es/2), %rax
        addq        %rdx, %rax                      // v_h0[t]
        movq        L_OUT(%rsp), %rcx
        leaq        (%r8,%r15,4), %rbx              // p of head 0 at t
        movq        %r13, %r10
        .if \n == 4
#if ATT_PF
        leaq        ATT_PFN(%r15), %rbp             // prefetch offset from v_h[t]: 64 es PFN, or
        cmpq        %r9, %rbp                       // into K_h+G once t + PFN >= n_pos (0: none)
        movq        L_PFB(%rsp), %rbp
        cmovaeq     L_DV(%rsp), %rbp
#endif
        .endif
.Lpv\@:
        .if \n == 4
#if ATT_PF
        pfrows      %rax, %rbp, (4*\es)             // the 4 rows PFN positions on
#endif
        .endif
        pvgroup     \es, \n
        addq        %r12, %rax
        addq        $256, %rcx
        addq        %r14, %rbx
        decq        %r10
        jnz         .Lpv\@
        .endm

        /* registers: rdi q_h0, rsi k_h0, rdx v_h0 (the first head's), r8 scratch, r9 n_pos,
         * r11 math_avx2, r12 head stride (bytes), r13 heads, r14 scratch row stride (bytes);
         * per group: rax position (p.V: row pointer), r15 / rax row pointer, rbp q_h, rbx scratch,
         * rcx out_h (p.V), r10 heads left */
        /* \body for t = 0, 4, 8, .. below L_N4 (t in \t, \t32 its low half; the loop at label \loop);
         * at label \done, t = the first position left */
        .macro  quads t, t32, loop, done, body:vararg
        xorl        \t32, \t32
        cmpq        $0, L_N4(%rsp)
        je          \done\()f
\loop:
        \body
        addq        $4, \t
        cmpq        L_N4(%rsp), \t
        jb          \loop\()b
\done:
        .endm

        .macro  attention_avx2 name, es
function \name
        push_callee
        subq        $A_LOC, %rsp
        movq        A_STRIDE(%rsp), %r12
        shlq        $(\es/2), %r12                  // head stride in bytes
        movq        A_BEGIN(%rsp), %rax
        movq        A_END(%rsp), %r13
        subq        %rax, %r13                      // heads
        jbe         9f
        movrel      %r11, math_avx2
        movq        %rax, %r10
        shlq        $8, %r10
        addq        %r10, %rdi                      // q_h0
        addq        %r10, %rcx
        movq        %rcx, L_OUT(%rsp)               // out_h0
        imulq       %r12, %rax
        addq        %rax, %rsi                      // k_h0
        addq        %rax, %rdx                      // v_h0
        leaq        15(%r9), %r14
        andq        $-16, %r14
        shlq        $2, %r14                        // scratch row stride: 4 roundup16(n_pos)
        movq        %r9, %rax
        andq        $-4, %rax
        movq        %rax, L_N4(%rsp)
        movq        %r13, L_LEFT(%rsp)
        movl        $1, %eax                        // heads per group: ATT_GROUP while a head's rows
        movl        $ATT_GROUP, %ecx                // are at most ATT_SHORT bytes, else 1 (a knob:
                                                    // -DATT_GROUP=, -DATT_SHORT=)
        cmpq        $(ATT_SHORT / (64*\es)), %r9
        cmovbeq     %rcx, %rax
        movq        %rax, L_G(%rsp)
#if ATT_PF
        movq        $0, L_PFB(%rsp)                 // groups of 1, or rows over ATT_PFMAX bytes:
        movq        $0, L_DK(%rsp)                  // no prefetch
        cmpq        $1, %rax
        je          31f
        cmpq        $(ATT_PFMAX / (64*\es)), %r9
        ja          31f
        movq        $(64*\es*ATT_PFN), L_PFB(%rsp)
        movq        %r9, %rcx
        shlq        $(6 + \es/2), %rcx              // n_pos rows in bytes
        movq        %rdx, %rbx
        subq        %rsi, %rbx
        subq        %rcx, %rbx
        addq        $(64*\es*ATT_PFN), %rbx
        movq        %rbx, L_DK(%rsp)                // V_h - K_h - 64 es n_pos + 64 es PFN
        movq        %r13, %r10
        cmpq        %rax, %r10
        cmovaq      %rax, %r10                      // the first group's heads: their first PFN rows of K
        movq        %rsi, %rbx
30:
        pflines     %rbx, , (\es*ATT_PFN)
        addq        %r12, %rbx
        decq        %r10
        jnz         30b
31:
#endif
1:                                                  // the next group of heads
        movq        L_LEFT(%rsp), %r13
        movq        L_G(%rsp), %rax
        cmpq        %rax, %r13
        cmovaq      %rax, %r13                      // heads of this group
        subq        %r13, L_LEFT(%rsp)
#if ATT_PF
        xorl        %eax, %eax
        cmpq        $0, L_PFB(%rsp)
        je          32f
        movq        %r13, %rax                      // L_DV: K_h+G - V_h - 64 es n_pos + 64 es PFN while
        imulq       %r12, %rax                      // the next group has G heads, else 0
        addq        %rsi, %rax
        subq        %rdx, %rax
        movq        %r9, %rcx
        shlq        $(6 + \es/2), %rcx
        subq        %rcx, %rax
        addq        $(64*\es*ATT_PFN), %rax
        xorl        %ecx, %ecx
        cmpq        %r13, L_LEFT(%rsp)
        cmovbq      %rcx, %rax
32:
        movq        %rax, L_DV(%rsp)
#endif

        /* scores: groups of 4 positions, the heads one after the other within a group */
        quads       %rax, %eax, 2, 3, score_heads \es, 0
        cmpq        %r9, %rax
        je          4f
        movq        %r9, %rbx
        subq        %rax, %rbx                      // 1..3 rows left: the missing ones repeat the last
        xorl        %r10d, %r10d                    // row (no over-read); their scores land in
        movl        $64*\es, %ecx                   // scratch[n_pos .. roundup4(n_pos)) of the row
        cmpq        $2, %rbx
        cmovaeq     %rcx, %r10                      // row 1: t+1 if it exists, else t
        movl        $128*\es, %ecx
        cmpq        $3, %rbx
        cmovbq      %r10, %rcx                      // row 2: t+2 if it exists, else row 1
        movq        %r10, L_O1(%rsp)
        movq        %rcx, L_O2(%rsp)
        score_heads \es, 1
4:
        /* p = softmax(s), each head's row in place */
        movq        %r8, %rbx
        movq        %r13, %r15
40:
        softmax_avx2 %rbx, %rbx, %r9, %r11, %rax, %r10, %rcx
        addq        %r14, %rbx
        decq        %r15
        jnz         40b

        /* o = sum_t p_t v_t: outputs zeroed, then groups of 4 positions, the heads one after the other */
        vxorps      %ymm0, %ymm0, %ymm0
        movq        L_OUT(%rsp), %rcx
        movq        %r13, %r10
5:
        st64        %rcx, 0, 0, 0, 0, 0, 0, 0, 0, 0
        addq        $256, %rcx
        decq        %r10
        jnz         5b
        quads       %r15, %r15d, 6, 7, pv_heads \es, 4
        cmpq        %r9, %r15                       // the last 1..3 positions one by one
        je          8f
        pv_heads    \es, 1
        incq        %r15
        jmp         7b
8:
        movq        %r13, %rax                      // the next group
        shlq        $8, %rax
        addq        %rax, %rdi
        addq        %rax, L_OUT(%rsp)
        movq        %r13, %rax
        imulq       %r12, %rax
        addq        %rax, %rsi
        addq        %rax, %rdx
        movq        %r13, %rax
        imulq       %r14, %rax
        addq        %rax, %r8
        cmpq        $0, L_LEFT(%rsp)
        jne         1b
9:
        addq        $A_LOC, %rsp
        pop_callee
        vzeroupper
        ret
endfunc
        .endm

        attention_avx2 gpt2asm_attention_f32_avx2, 4
        attention_avx2 gpt2asm_attention_f16_avx2, 2

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_attention_rows_f32_avx2(const float *q, const float *k, const float *v, float *out,
 *                                      float *scratch, size_t n_pos, size_t n_rows, size_t ldq,
 *                                      size_t ldo);
 * void gpt2asm_attention_rows_f16_avx2(const float *q, const uint16_t *k, const uint16_t *v,
 *                                      float *out, float *scratch, size_t n_pos, size_t n_rows,
 *                                      size_t ldq, size_t ldo);                (binary16 cache, F16C)
 *
 *   One head, n_rows (1..4) consecutive query rows of a prompt, row r over positions 0 .. n_pos+r-1:
 *     for r < n_rows:  out + r ldo = gpt2asm_attention_f32(q + r ldq, k, v, ., ., n_pos + r, ., 0, 1)
 *   bit for bit (k, v: the head's cache rows, 64 elements each; q, out: the head's 64 floats of each
 *   row, ldq / ldo floats apart).  scratch: n_rows rows of S = roundup16(n_pos + n_rows - 1) floats.
 *   Reads cache rows 0 .. n_pos + n_rows - 2.  n_pos >= 1; n_rows outside 1..4 does nothing.
 *
 * The rows share every cache row they have in common, read (and, binary16, widened) once:
 *   scores: per position t < n_pos + n_rows - 1, k_t in ymm8-15, then each row's dot64 with its q
 *           from memory (the operands in the roles of dotpos_avx2: q * k + acc), the 4 rows' hsum16
 *           trees transposed as dot4_avx2 does for 4 positions (tree4_avx2), one score per row;
 *           a row's scores past its own n_pos + r are computed and never read;
 *   softmax of each row (n_pos + r entries);
 *   p.V:    per quarter of the 64 outputs, the 4 rows' 16 sums in ymm0-7 for the whole pass: positions
 *           t < n_pos for every row, then t = n_pos + j for the rows r > j only.
 * Rows past n_rows repeat the last one (the same operands, so the same values, stored twice).
 */
#define RL_EXTRA     0
#include "attn_rows.h"

/*
 * dotrow r, qp
 *   xmm\r = lanes s[0..3] of dot64(q, k_t) after the w = 8 and w = 4 steps of the hsum16 tree, for the
 *   64 floats of q at (\qp) and k_t in ymm8-15 (elements 0-7, 8-15, ..., 56-63); the operations of
 *   dotpos_avx2.  Clobbers ymm4-7.
 */
        .macro  dotrow r, qp
        vxorps      %ymm4, %ymm4, %ymm4
        vxorps      %ymm5, %ymm5, %ymm5
        vmovups       0(\qp), %ymm6
        vmovups      32(\qp), %ymm7
        vfmadd231ps %ymm8,  %ymm6, %ymm4            // c = 0, lanes 0-7
        vfmadd231ps %ymm9,  %ymm7, %ymm5            // c = 0, lanes 8-15
        vmovups      64(\qp), %ymm6
        vmovups      96(\qp), %ymm7
        vfmadd231ps %ymm10, %ymm6, %ymm4            // c = 1
        vfmadd231ps %ymm11, %ymm7, %ymm5
        vmovups     128(\qp), %ymm6
        vmovups     160(\qp), %ymm7
        vfmadd231ps %ymm12, %ymm6, %ymm4            // c = 2
        vfmadd231ps %ymm13, %ymm7, %ymm5
        vmovups     192(\qp), %ymm6
        vmovups     224(\qp), %ymm7
        vfmadd231ps %ymm14, %ymm6, %ymm4            // c = 3
        vfmadd231ps %ymm15, %ymm7, %ymm5
        vaddps      %ymm5, %ymm4, %ymm4             // w = 8
        vextractf128 $1, %ymm4, %xmm5
        vaddps      %xmm5, %xmm4, %xmm\r            // w = 4
        .endm

/*
 * pvq es, first
 *   o_r = fma(p_r[t], v_t, o_r) for the rows r = first .. 3 and the 16 outputs of the quarter: v_t's
 *   16 elements at (%rsi) into ymm12-13 (widened if binary16), p_r[t] at (%rax) + (0, r10, r12, r13),
 *   o_r in ymm(2r), ymm(2r+1).  Clobbers ymm8-13.
 */
        .macro  pvfma p, a0, a1
        vfmadd231ps %ymm12, %ymm\p, %ymm\a0
        vfmadd231ps %ymm13, %ymm\p, %ymm\a1
        .endm

        .macro  pvq es, first
        ldrow       \es, %rsi, 0, 12, 13
        .if \first == 0
        vbroadcastss (%rax), %ymm8
        pvfma       8, 0, 1
        .endif
        .if \first <= 1
        vbroadcastss (%rax,%r10), %ymm9
        pvfma       9, 2, 3
        .endif
        .if \first <= 2
        vbroadcastss (%rax,%r12), %ymm10
        pvfma       10, 4, 5
        .endif
        vbroadcastss (%rax,%r13), %ymm11
        pvfma       11, 6, 7
        .endm

        /* registers: scores: rdi / rcx / rbx / rbp q of rows 0-3, rsi k_t, rax scratch column t,
         * r10 / r12 / r13 scratch offsets of rows 1-3, r14 scratch row stride (bytes), r15 positions
         * left, r8 scratch, r9 n_pos, r11 math_avx2; p.V: rdx v quarter, rsi v_t quarter, rax p column,
         * rdi out quarter (row 0) */
        .macro  attention_rows_avx2 name, es
function \name
        rows_enter  math_avx2

        /* scores of every row at positions 0 .. nmax - 1 */
        movq        %r8, %rax
1:
        ldrow       \es, %rsi, 0, 8, 9, 10, 11, 12, 13, 14, 15
        dotrow      0, %rdi
        dotrow      1, %rcx
        dotrow      2, %rbx
        dotrow      3, %rbp
        tree4_avx2
        vmovss      %xmm0, (%rax)
        vextractps  $1, %xmm0, (%rax,%r10)
        vextractps  $2, %xmm0, (%rax,%r12)
        vextractps  $3, %xmm0, (%rax,%r13)
        addq        $4, %rax
        addq        $64*\es, %rsi
        decq        %r15
        jnz         1b

        /* p = softmax(s) of row r over its n_pos + r scores, in place */
        movq        %r8, %rbx
        movq        %r9, %r15
        movq        RL_R(%rsp), %rax
        movq        %rax, RL_CNT(%rsp)
2:
        softmax_avx2 %rbx, %rbx, %r15, %r11, %rax, %r10, %rcx
        addq        %r14, %rbx
        incq        %r15
        decq        RL_CNT(%rsp)
        jnz         2b

        /* o = sum_t p_t v_t, a quarter of the outputs (16) per pass */
        movq        RL_S1(%rsp), %r10
        movq        RL_S2(%rsp), %r12
        movq        RL_S3(%rsp), %r13
        movq        RL_V(%rsp), %rdx
        movq        RL_OUT(%rsp), %rdi
        movq        $4, RL_CNT(%rsp)
3:
        vzero       0, 1, 2, 3, 4, 5, 6, 7
        movq        %rdx, %rsi
        movq        %r8, %rax
        movq        %r9, %r15
        rows_pv     pvq, \es
        movq        RL_O1(%rsp), %rcx
        movq        RL_O2(%rsp), %rbx
        movq        RL_O3(%rsp), %rbp
        vmovups     %ymm0,   (%rdi)
        vmovups     %ymm1, 32(%rdi)
        vmovups     %ymm2,   (%rdi,%rcx)
        vmovups     %ymm3, 32(%rdi,%rcx)
        vmovups     %ymm4,   (%rdi,%rbx)
        vmovups     %ymm5, 32(%rdi,%rbx)
        vmovups     %ymm6,   (%rdi,%rbp)
        vmovups     %ymm7, 32(%rdi,%rbp)
        addq        $16*\es, %rdx                   // the next quarter
        addq        $64, %rdi
        decq        RL_CNT(%rsp)
        jnz         3b
9:
        addq        $RL_LOC, %rsp
        pop_callee
        vzeroupper
        ret
endfunc
        .endm

        attention_rows_avx2 gpt2asm_attention_rows_f32_avx2, 4
        attention_rows_avx2 gpt2asm_attention_rows_f16_avx2, 2
