/*
 * asm/x86_64/attn_avx512.S -- single-query causal self-attention over the KV cache, AVX-512F.
 *
 * Per head: scores 16 positions per step (one zmm of 16 dot64 lanes per position, then the hsum16
 * trees of the 16 positions done together by a transposing reduction: 15 shuffle pairs and adds give
 * the 16 scores in one zmm), softmax in scratch (the same macro as gpt2asm_softmax_f32_avx512), then
 * p.V with the 64 outputs in 4 zmm accumulators and one broadcast of p_t per position.
 * Bit-identical to attn_avx2.S: the same fma/add sequence per lane, only the data movement differs.
 */
#include "asm.S"
#include "math_avx512.h"

/*
 * Software prefetch of the cache rows (ATT_PF = 1; -DATT_PF=0 builds without it): the rows of a call are
 * read as one logical stream, K_h then V_h of each head h in turn, and every loop step prefetches
 * (ATT_PFOP) the lines ATT_PFD bytes further along that stream, so the end of K_h prefetches the start
 * of V_h and the end of V_h the start of K_{h+1}; the first ATT_PFD bytes of the first head's K are
 * prefetched on entry.  Prefetches are hints: they never fault and change no result.  Measured on Zen 4
 * (docs/notes.md): the batched decode's float32 BATTN 7-9 % faster at positions 200-500 (the heads one
 * after the other: every head starts two new short streams, which the hardware prefetchers pick up
 * late); a cold single call 6-16 % faster at positions 60-200, the same at 500-1000.
 */
#ifndef ATT_PF
#define ATT_PF      1
#endif
#ifndef ATT_PFD
#define ATT_PFD     4096
#endif
#ifndef ATT_PFOP
#define ATT_PFOP    prefetcht2
#endif

/* pflines p, n: ATT_PFOP of the n lines from (\p) */
        .macro  pflines p, n
        .set        pf_off, 0
        .rept       \n
        ATT_PFOP    pf_off(\p)
        .set        pf_off, pf_off + 64
        .endr
        .endm

/*
 * dotpos_avx512 acc, p, d
 *   zmm\acc = the 16 lanes acc[j] of dot64(q, row) for the row of 64 floats at \d(\p), q in zmm16-19:
 *     acc[j] = +0.0;  acc[j] = fma(q[16c+j], row[16c+j], acc[j]) for c = 0..3
 */
        .macro  dotpos_avx512 acc, p, d
        vpxord      %zmm\acc, %zmm\acc, %zmm\acc
        vfmadd231ps \d+  0(\p), %zmm16, %zmm\acc
        vfmadd231ps \d+ 64(\p), %zmm17, %zmm\acc
        vfmadd231ps \d+128(\p), %zmm18, %zmm\acc
        vfmadd231ps \d+192(\p), %zmm19, %zmm\acc
        .endm

/*
 * reduce16_avx512
 *   zmm0 = { hsum16 tree of the lanes of R_{(p%4)*4 + p/4} : p = 0..15 } * 0.125f, where R_i = zmm_i.
 *   Step w pairs two registers and adds the two halves of each, so every lane sum takes exactly the
 *   adds s[j] + s[j+w] (j < w) of hsum16 in tree order.  After the four steps lane 4i+m holds the sum
 *   of R_{4m+i}: hence the position-to-register mapping above.  Clobbers zmm0-15, zmm20, zmm21.
 */
        .macro  red_pair64 d, a, b                  // w = 8: [a.lo8 + a.hi8 | b.lo8 + b.hi8]
        vshuff64x2  $0x44, %zmm\b, %zmm\a, %zmm20
        vshuff64x2  $0xEE, %zmm\b, %zmm\a, %zmm21
        vaddps      %zmm21, %zmm20, %zmm\d
        .endm
        .macro  red_pair32 d, a, b                  // w = 4 within each 8-lane half
        vshuff32x4  $0x88, %zmm\b, %zmm\a, %zmm20
        vshuff32x4  $0xDD, %zmm\b, %zmm\a, %zmm21
        vaddps      %zmm21, %zmm20, %zmm\d
        .endm
        .macro  red_pairps d, a, b, lo, hi          // w = 2 (0x44/0xEE) and w = 1 (0x88/0xDD)
        vshufps     $\lo, %zmm\b, %zmm\a, %zmm20
        vshufps     $\hi, %zmm\b, %zmm\a, %zmm21
        vaddps      %zmm21, %zmm20, %zmm\d
        .endm

        .macro  reduce16_avx512
        red_pair64  0, 0, 1
        red_pair64  1, 2, 3
        red_pair64  2, 4, 5
        red_pair64  3, 6, 7
        red_pair64  4, 8, 9
        red_pair64  5, 10, 11
        red_pair64  6, 12, 13
        red_pair64  7, 14, 15
        red_pair32  0, 0, 1
        red_pair32  1, 2, 3
        red_pair32  2, 4, 5
        red_pair32  3, 6, 7
        red_pairps  0, 0, 1, 0x44, 0xEE
        red_pairps  1, 2, 3, 0x44, 0xEE
        red_pairps  0, 0, 1, 0x88, 0xDD
        vmulps      KZ_EIGHTH(%r11){1to16}, %zmm0, %zmm0    // * 0.125
        .endm

/*
 * tailpos_avx512 p, acc
 *   dotpos of position p of the last, partial group: row p if p <= %rbx (the last valid row of the
 *   group), else the last valid row again (%r10), so no row past n_pos is read.
 */
        .macro  tailpos_avx512 p, acc
        leaq        256*\p(%r15), %rcx
        cmpq        $\p, %rbx
        cmovbq      %r10, %rcx
        dotpos_avx512 \acc, %rcx, 0
        .endm

/*
 * void gpt2asm_attention_f32_avx512(const float *q, const float *k, const float *v, float *out,
 *                                   float *scratch, size_t n_pos, size_t head_stride,
 *                                   size_t head_begin, size_t head_end);
 *
 *   for h in [head_begin, head_end):
 *     s_t    = dot64(q_h, k_h[t]) * 0.125f                 t < n_pos   (k_h = k + h*head_stride)
 *     p      = softmax(s)            (in scratch row h - head_begin, as gpt2asm_softmax_f32)
 *     out_h  = sum_t p_t v_h[t]   (o = +0.0; o = fma(p_t, v_h[t], o) for t = 0, 1, ...)
 *   scratch: (head_end - head_begin) rows of roundup16(n_pos) floats; n_pos >= 1.
 *   (Head by head; the AVX2 kernel interleaves the heads position by position, which the same
 *   operations allow.  Not measured on AVX-512 hardware.)
 */
#define L_OUT       0                               /* out, reloaded per head               */
#define L_DK        8                               /* prefetch: V_h - end of K_h           */
#define L_DV       16                               /* prefetch: K_h+1 - end of V_h         */
#define L_LOC      24
function gpt2asm_attention_f32_avx512
        push_callee
        subq        $L_LOC, %rsp
        movq        %rcx, L_OUT(%rsp)
        movq        L_LOC+56(%rsp), %r12
        shlq        $2, %r12                        // head stride in bytes
        movq        L_LOC+64(%rsp), %r13            // h = head_begin
        movq        L_LOC+72(%rsp), %r14            // head_end
        movrel      %r11, math_avx512
        cmpq        %r14, %r13
        jae         9f
#if ATT_PF
        movq        %r13, %rax
        imulq       %r12, %rax
        addq        %rsi, %rax                      // k_h of the first head
        pflines     %rax, (ATT_PFD/64)
#endif
1:
        movq        %r13, %rax
        shlq        $8, %rax
        vmovups       0(%rdi,%rax), %zmm16          // q_h
        vmovups      64(%rdi,%rax), %zmm17
        vmovups     128(%rdi,%rax), %zmm18
        vmovups     192(%rdi,%rax), %zmm19
        movq        %r13, %rax
        imulq       %r12, %rax
        leaq        (%rsi,%rax), %r15               // k_h
        leaq        (%rdx,%rax), %rbp               // v_h
#if ATT_PF
        movq        %r9, %rbx
        shlq        $8, %rbx
        addq        %r15, %rbx                      // end of K_h (rbx: the scores loop's)
        movq        %rbp, %rcx
        subq        %rbx, %rcx
        movq        %rcx, L_DK(%rsp)                // V_h - end of K_h
        leaq        (%r15,%r12), %rcx               // K_h+1 - end of V_h = K_h+1 - V_h - (end K_h - K_h)
        subq        %rbp, %rcx
        subq        %rbx, %rcx
        addq        %r15, %rcx
        leaq        1(%r13), %rax
        cmpq        %r14, %rax
        jb          10f
        movq        $-ATT_PFD, %rcx                 // the last head: nothing next (the prefetch
10:                                                 // repeats the current line)
        movq        %rcx, L_DV(%rsp)
#endif

        /* scores, 16 positions per step; position p goes to zmm (p%4)*4 + p/4 */
        whole_loop  %r9, %r10, 16, 3f                   // n16, t = 0
2:
#if ATT_PF
        leaq        ATT_PFD(%r15), %rcx
        cmpq        %rbx, %rcx
        jb          11f
        addq        L_DK(%rsp), %rcx                // past K_h: into V_h
11:
        pflines     %rcx, 64
#endif
        dotpos_avx512  0, %r15,  0*256
        dotpos_avx512  4, %r15,  1*256
        dotpos_avx512  8, %r15,  2*256
        dotpos_avx512 12, %r15,  3*256
        dotpos_avx512  1, %r15,  4*256
        dotpos_avx512  5, %r15,  5*256
        dotpos_avx512  9, %r15,  6*256
        dotpos_avx512 13, %r15,  7*256
        dotpos_avx512  2, %r15,  8*256
        dotpos_avx512  6, %r15,  9*256
        dotpos_avx512 10, %r15, 10*256
        dotpos_avx512 14, %r15, 11*256
        dotpos_avx512  3, %r15, 12*256
        dotpos_avx512  7, %r15, 13*256
        dotpos_avx512 11, %r15, 14*256
        dotpos_avx512 15, %r15, 15*256
        reduce16_avx512
        vmovups     %zmm0, (%r8,%rax,4)
        addq        $4096, %r15
        addq        $16, %rax
        cmpq        %r10, %rax
        jb          2b
3:
        cmpq        %r9, %r10
        je          4f
        movq        %r9, %rbx
        subq        %r10, %rbx
        decq        %rbx                            // last valid row of the group (0..14)
        movq        %rbx, %r10
        shlq        $8, %r10
        addq        %r15, %r10                      // its address
        dotpos_avx512  0, %r15, 0
        tailpos_avx512  1,  4
        tailpos_avx512  2,  8
        tailpos_avx512  3, 12
        tailpos_avx512  4,  1
        tailpos_avx512  5,  5
        tailpos_avx512  6,  9
        tailpos_avx512  7, 13
        tailpos_avx512  8,  2
        tailpos_avx512  9,  6
        tailpos_avx512 10, 10
        tailpos_avx512 11, 14
        tailpos_avx512 12,  3
        tailpos_avx512 13,  7
        tailpos_avx512 14, 11
        tailpos_avx512 15, 15
        reduce16_avx512
        vmovups     %zmm0, (%r8,%rax,4)             // scratch[t .. t+16) <= roundup16(n_pos)
4:
        /* p = softmax(s), in place */
        softmax_avx512 %r8, %r8, %r9, %r11, %rax, %r10, %rbx

        /* o = sum_t p_t v_t */
        vclear  vpxord, zmm, 0, 1, 2, 3
        movq        %rbp, %rax                      // v_h[t]
        xorl        %r10d, %r10d                    // t
        movq        %r9, %rbx
        shrq        $1, %rbx                        // position pairs
        jz          6f
#if ATT_PF
        movq        %r9, %r15
        shlq        $8, %r15
        addq        %rbp, %r15                      // end of V_h
#endif
5:
#if ATT_PF
        leaq        ATT_PFD(%rax), %rcx
        cmpq        %r15, %rcx
        jb          12f
        addq        L_DV(%rsp), %rcx                // past V_h: into K_h+1
12:
        pflines     %rcx, 8
#endif
        vbroadcastss  (%r8,%r10,4), %zmm4           // p_t
        vbroadcastss 4(%r8,%r10,4), %zmm5           // p_t+1
        vmemop3 vfmadd231ps, %zmm4, %rax, 0, 64, zmm, 0,1,2,3  // o = fma(p_t, v_t, o)
        vmemop3 vfmadd231ps, %zmm5, %rax, 256, 64, zmm, 0,1,2,3
        addq        $512, %rax
        addq        $2, %r10
        decq        %rbx
        jnz         5b
6:
        testb       $1, %r9b
        jz          7f
        vbroadcastss (%r8,%r10,4), %zmm4
        vmemop3 vfmadd231ps, %zmm4, %rax, 0, 64, zmm, 0,1,2,3
7:
        movq        %r13, %rax
        shlq        $8, %rax
        addq        L_OUT(%rsp), %rax               // out_h
        vstore  %rax, 0, 64, zmm, 0,1,2,3
        leaq        15(%r9), %rax
        andq        $-16, %rax
        leaq        (%r8,%rax,4), %r8               // the next head's scratch row
        incq        %r13
        cmpq        %r14, %r13
        jb          1b
9:
        addq        $L_LOC, %rsp
        pop_callee
        vzeroupper
        ret
endfunc
