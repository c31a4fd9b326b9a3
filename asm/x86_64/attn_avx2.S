/*
 * asm/x86_64/attn_avx2.S -- single-query causal self-attention over the KV cache, AVX2 + FMA.
 *
 * Per head: scores (4 positions per step: per position two ymm partial sums = the 16 lanes of dot64,
 * then the hsum16 tree of the 4 positions transposed into one xmm), softmax in scratch (the same
 * macro as gpt2asm_softmax_f32_avx2), then p.V with the 64 outputs in 8 ymm accumulators and one
 * broadcast of p_t per position.  K and V rows are streamed once each.  The same code serves a float32
 * cache and a binary16 one (gpt2asm_attention_f16_avx2: each row widened exactly with vcvtph2ps).
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
 *     p      = softmax(s)                                  (in scratch, as gpt2asm_softmax_f32)
 *     out_h  = sum_t p_t v_h[t]   (o = +0.0; o = fma(p_t, v_h[t], o) for t = 0, 1, ...)
 *   scratch: roundup16(n_pos) floats; n_pos >= 1.
 */
        .macro  attention_avx2 name, es
function \name
        pushq       %rbx
        pushq       %rbp
        pushq       %r12
        pushq       %r13
        pushq       %r14
        pushq       %r15
        pushq       %rcx                            // out, reloaded per head
        movq        64(%rsp), %r12
        shlq        $(\es/2), %r12                  // head stride in bytes
        movq        72(%rsp), %r13                  // h = head_begin
        movq        80(%rsp), %r14                  // head_end
        movrel      %r11, math_avx2
        cmpq        %r14, %r13
        jae         9f
1:
        movq        %r13, %rax
        shlq        $8, %rax
        vmovups       0(%rdi,%rax), %ymm8           // q_h
        vmovups      32(%rdi,%rax), %ymm9
        vmovups      64(%rdi,%rax), %ymm10
        vmovups      96(%rdi,%rax), %ymm11
        vmovups     128(%rdi,%rax), %ymm12
        vmovups     160(%rdi,%rax), %ymm13
        vmovups     192(%rdi,%rax), %ymm14
        vmovups     224(%rdi,%rax), %ymm15
        movq        %r13, %rax
        imulq       %r12, %rax
        leaq        (%rsi,%rax), %r15               // k_h
        leaq        (%rdx,%rax), %rbp               // v_h

        /* scores, 4 positions per step */
        movq        %r9, %r10
        andq        $-4, %r10                       // n4
        xorl        %eax, %eax                      // t
        testq       %r10, %r10
        jz          3f
2:
        dot4_avx2   \es, %r15, 0, %r15, 64*\es, %r15, 128*\es, %r15, 192*\es
        vmovups     %xmm0, (%r8,%rax,4)
        addq        $256*\es, %r15
        addq        $4, %rax
        cmpq        %r10, %rax
        jb          2b
3:
        cmpq        %r9, %r10
        je          4f
        movq        %r9, %rbx
        subq        %r10, %rbx                      // 1..3 rows left: the missing ones repeat
        leaq        64*\es(%r15), %r10              // the last row (no over-read); their scores
        leaq        128*\es(%r15), %rcx             // land in scratch[n_pos .. roundup4(n_pos))
        cmpq        $2, %rbx
        cmovbq      %r15, %r10
        cmovbeq     %r10, %rcx
        dot4_avx2   \es, %r15, 0, %r10, 0, %rcx, 0, %rcx, 0
        vmovups     %xmm0, (%r8,%rax,4)
4:
        /* p = softmax(s), in place */
        softmax_avx2 %r8, %r8, %r9, %r11, %rax, %r10, %rbx

        /* o = sum_t p_t v_t */
        vxorps      %ymm0, %ymm0, %ymm0
        vxorps      %ymm1, %ymm1, %ymm1
        vxorps      %ymm2, %ymm2, %ymm2
        vxorps      %ymm3, %ymm3, %ymm3
        vxorps      %ymm4, %ymm4, %ymm4
        vxorps      %ymm5, %ymm5, %ymm5
        vxorps      %ymm6, %ymm6, %ymm6
        vxorps      %ymm7, %ymm7, %ymm7
        movq        %rbp, %rax                      // v_h[t]
        xorl        %r10d, %r10d                    // t
        movq        %r9, %rbx
        shrq        $1, %rbx                        // position pairs
        jz          6f
5:
        vbroadcastss  (%r8,%r10,4), %ymm8           // p_t
        vbroadcastss 4(%r8,%r10,4), %ymm9           // p_t+1
        pvrow       \es, %ymm8, 0                   // o = fma(p_t, v_t, o)
        pvrow       \es, %ymm9, 64*\es              // o = fma(p_t+1, v_t+1, o)
        addq        $128*\es, %rax
        addq        $2, %r10
        decq        %rbx
        jnz         5b
6:
        testb       $1, %r9b
        jz          7f
        vbroadcastss (%r8,%r10,4), %ymm8
        pvrow       \es, %ymm8, 0
7:
        movq        %r13, %rax
        shlq        $8, %rax
        addq        (%rsp), %rax                    // out_h
        vmovups     %ymm0,   0(%rax)
        vmovups     %ymm1,  32(%rax)
        vmovups     %ymm2,  64(%rax)
        vmovups     %ymm3,  96(%rax)
        vmovups     %ymm4, 128(%rax)
        vmovups     %ymm5, 160(%rax)
        vmovups     %ymm6, 192(%rax)
        vmovups     %ymm7, 224(%rax)
        incq        %r13
        cmpq        %r14, %r13
        jb          1b
9:
        popq        %rcx
        popq        %r15
        popq        %r14
        popq        %r13
        popq        %r12
        popq        %rbp
        popq        %rbx
        vzeroupper
        ret
endfunc
        .endm

        attention_avx2 gpt2asm_attention_f32_avx2, 4
        attention_avx2 gpt2asm_attention_f16_avx2, 2
