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

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_attention_rows_f32_avx512(const float *q, const float *k, const float *v, float *out,
 *                                        float *scratch, size_t n_pos, size_t n_rows, size_t ldq,
 *                                        size_t ldo);
 * void gpt2asm_attention_rows_f16_avx512(const float *q, const uint16_t *k, const uint16_t *v,
 *                                        float *out, float *scratch, size_t n_pos, size_t n_rows,
 *                                        size_t ldq, size_t ldo);        (binary16 cache, vcvtph2ps)
 *
 *   One head, n_rows (1..4) consecutive query rows of a prompt, row r over positions 0 .. n_pos+r-1:
 *     for r < n_rows:  out + r ldo = gpt2asm_attention_f32(q + r ldq, k, v, ., ., n_pos + r, ., 0, 1)
 *   bit for bit, and bit for bit gpt2asm_attention_rows_{f32,f16}_avx2 (the same contract, scratch
 *   layout and memory rules: scratch n_rows rows of S = roundup16(n_pos + n_rows - 1) floats; reads
 *   cache rows 0 .. n_pos + n_rows - 2; n_pos >= 1; n_rows outside 1..4 does nothing).
 *
 * The rows share every cache row they have in common, read (and, binary16, widened) once:
 *   scores: the 4 rows' q in zmm16-31 (row r, elements 16c..16c+15 in zmm16+4r+c) for the whole pass;
 *           per group of 4 positions t+a (a = 0..3) the 16 dot64 lane vectors of (position a, row r)
 *           in zmm(4a+r): acc = +0.0; acc = fma(q_r[16c+j], k_t+a[16c+j], acc) for c = 0..3 (q the
 *           register operand, k the memory one: q * k + acc as dotpos_avx2), the 16 hsum16 trees done
 *           together by the transposing reduction of gpt2asm_attention_f32_avx512 (with one temporary:
 *           zmm16-31 are taken), * 0.125f, lanes 4r..4r+3 = row r's 4 scores into its scratch row.
 *           binary16 (zgroup_h): the 4 rows' q are copied once into a 1 KiB stack buffer, and the group
 *           runs chunk by chunk: for c = 0..3, q_r[16c..] from the buffer into zmm16-19 and the 4 k rows'
 *           elements 16c.. widened exactly (vcvtph2ps) into zmm20-23, then the 16 fmas (the same q * k +
 *           acc, the same order c = 0..3 per sum; widening k into a stack buffer as the FMAs' memory
 *           operands instead, 16 zmm stores a group reloaded at once, was 8 % slower on Zen 5).
 *           The last 1..3 positions: the missing ones
 *           repeat the last row (no over-read), their scores land past n_pos + n_rows - 1 in the row;
 *           a row's scores past its own n_pos + r are computed and never read;
 *   softmax of each row (n_pos + r entries; the macro of gpt2asm_softmax_f32_avx512);
 *   p.V:    one pass, the 4 rows x 64 outputs in zmm0-15 (row r in zmm4r .. 4r+3); per position v_t
 *           in zmm16-19 (widened if binary16), p_r[t] broadcast into zmm20+r, o = fma(p, v, o):
 *           positions t < n_pos for every row, then t = n_pos + j for the rows r > j only.
 * Rows past n_rows repeat the last one (the same operands, so the same values, stored twice).
 * zmm16-31 are zeroed before returning (vzeroupper leaves them).
 */
#define RL_EXTRA     (1024 + 64)                    /* binary16: 1 KiB (+ 64 to align) of q at RL_BUF */
#include "attn_rows.h"

/*
 * zrp op, lo, hi, d, a, b, t
 *   one step of the transposing reduction (red_pair64 / red_pair32 / red_pairps) with one temporary
 *   zmm\t (not \a, \b; may be \d): t = op(lo: b, a), a = op(hi: b, a), d = t + a (lo + hi, the
 *   operands in the roles of red_pair*).
 */
        .macro  zrp op, lo, hi, d, a, b, t
        \op         $\lo, %zmm\b, %zmm\a, %zmm\t
        \op         $\hi, %zmm\b, %zmm\a, %zmm\a
        vaddps      %zmm\a, %zmm\t, %zmm\d
        .endm

/* zdot R, r, p, d: zmm\R = +0.0, then the 4 fmas of row r with the k row at \d(\p) (float32) */
        .macro  zdot0 R
        vpxord      %zmm\R, %zmm\R, %zmm\R
        .endm
        .macro  zdotc R, Q, c, p, d                 // Q = zmm of q_r[16c..16c+16)
        vfmadd231ps \d+64*\c(\p), %zmm\Q, %zmm\R
        .endm
        /* zdotcs c, q0, q1, q2, q3, p0, d0, ..., p3, d3: step c of the 15 first registers (the zmm of
         * q_r[16c..] in \qr) */
        .macro  zdotcs c, q0, q1, q2, q3, p0, d0, p1, d1, p2, d2, p3, d3
        zdotc  0, \q0, \c, \p0, \d0
        zdotc  1, \q1, \c, \p0, \d0
        zdotc  2, \q2, \c, \p0, \d0
        zdotc  3, \q3, \c, \p0, \d0
        zdotc  4, \q0, \c, \p1, \d1
        zdotc  5, \q1, \c, \p1, \d1
        zdotc  6, \q2, \c, \p1, \d1
        zdotc  7, \q3, \c, \p1, \d1
        zdotc  8, \q0, \c, \p2, \d2
        zdotc  9, \q1, \c, \p2, \d2
        zdotc 10, \q2, \c, \p2, \d2
        zdotc 11, \q3, \c, \p2, \d2
        zdotc 12, \q0, \c, \p3, \d3
        zdotc 13, \q1, \c, \p3, \d3
        zdotc 14, \q2, \c, \p3, \d3
        .endm

/*
 * zred_rest: the transposing reduction of the 16 dot64 lane vectors zmm(4a+r) after its first step (zrp
 * vshuff64x2 0x44 / 0xEE into zmm0 from zmm0, zmm1): zmm0 = lanes 4r+a, each the hsum16 tree of
 * gpt2asm_attention_f32_avx512, * 0.125f.  Clobbers zmm1-15.
 */
        .macro  zred_rest
        zrp  vshuff64x2, 0x44, 0xEE, 1, 2, 3, 1
        zrp  vshuff64x2, 0x44, 0xEE, 2, 4, 5, 2
        zrp  vshuff64x2, 0x44, 0xEE, 3, 6, 7, 3
        zrp  vshuff64x2, 0x44, 0xEE, 4, 8, 9, 4
        zrp  vshuff64x2, 0x44, 0xEE, 5, 10, 11, 5
        zrp  vshuff64x2, 0x44, 0xEE, 6, 12, 13, 6
        zrp  vshuff64x2, 0x44, 0xEE, 7, 14, 15, 7
        zrp  vshuff32x4, 0x88, 0xDD, 0, 0, 1, 8     // w = 4
        zrp  vshuff32x4, 0x88, 0xDD, 1, 2, 3, 9
        zrp  vshuff32x4, 0x88, 0xDD, 2, 4, 5, 10
        zrp  vshuff32x4, 0x88, 0xDD, 3, 6, 7, 11
        zrp  vshufps, 0x44, 0xEE, 0, 0, 1, 8        // w = 2
        zrp  vshufps, 0x44, 0xEE, 1, 2, 3, 9
        zrp  vshufps, 0x88, 0xDD, 0, 0, 1, 8        // w = 1
        vmulps      KZ_EIGHTH(%r11){1to16}, %zmm0, %zmm0    // * 0.125
        .endm

/*
 * zgroup p0, d0, p1, d1, p2, d2, p3, d3
 *   zmm0 = lanes 4r+a: the score (* 0.125f) of row r at the float32 k row \da(\pa), a = 0..3.
 *   Register of (position a, row r): zmm(4a+r).  zmm15 is the first reduction step's temporary, so
 *   (a = 3, r = 3) is computed after it.  Clobbers zmm0-15.
 */
        .macro  zgroup p0, d0, p1, d1, p2, d2, p3, d3
        .irp R, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14
        zdot0       \R
        .endr
        zdotcs 0, 16, 20, 24, 28, \p0, \d0, \p1, \d1, \p2, \d2, \p3, \d3
        zdotcs 1, 17, 21, 25, 29, \p0, \d0, \p1, \d1, \p2, \d2, \p3, \d3
        zdotcs 2, 18, 22, 26, 30, \p0, \d0, \p1, \d1, \p2, \d2, \p3, \d3
        zdotcs 3, 19, 23, 27, 31, \p0, \d0, \p1, \d1, \p2, \d2, \p3, \d3
        zrp  vshuff64x2, 0x44, 0xEE, 0, 0, 1, 15    // w = 8, its first step
        zdot0       15
        zdotc 15, 28, 0, \p3, \d3
        zdotc 15, 29, 1, \p3, \d3
        zdotc 15, 30, 2, \p3, \d3
        zdotc 15, 31, 3, \p3, \d3
        zred_rest
        .endm

/*
 * zgroup_h p0, d0, p1, d1, p2, d2, p3, d3
 *   zgroup for binary16 k rows at \da(\pa): zmm0 = lanes 4r+a, the scores (* 0.125f).  Per chunk c = 0..3:
 *   q_r[16c..16c+16) of the 4 rows from the buffer at (%rdi) (row r at 256 r) into zmm16-19, the 4 k rows'
 *   elements 16c.. widened into zmm20-23, acc(a, r) = zmm(4a+r) = fma(q_r, k_a, acc) (q the register
 *   multiplicand, k the other, as zdotc); then zgroup's reduction (its first temporary zmm24).  Clobbers
 *   zmm0-24.
 */
        .macro  zgroup_h p0, d0, p1, d1, p2, d2, p3, d3
        .irp R, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        zdot0       \R
        .endr
        .irp c, 0,1,2,3
        vmovaps     64*\c(%rdi), %zmm16
        vmovaps     256+64*\c(%rdi), %zmm17
        vmovaps     512+64*\c(%rdi), %zmm18
        vmovaps     768+64*\c(%rdi), %zmm19
        vcvtph2ps   \d0+32*\c(\p0), %zmm20
        vcvtph2ps   \d1+32*\c(\p1), %zmm21
        vcvtph2ps   \d2+32*\c(\p2), %zmm22
        vcvtph2ps   \d3+32*\c(\p3), %zmm23
        vfmadd231ps %zmm20, %zmm16, %zmm0
        vfmadd231ps %zmm20, %zmm17, %zmm1
        vfmadd231ps %zmm20, %zmm18, %zmm2
        vfmadd231ps %zmm20, %zmm19, %zmm3
        vfmadd231ps %zmm21, %zmm16, %zmm4
        vfmadd231ps %zmm21, %zmm17, %zmm5
        vfmadd231ps %zmm21, %zmm18, %zmm6
        vfmadd231ps %zmm21, %zmm19, %zmm7
        vfmadd231ps %zmm22, %zmm16, %zmm8
        vfmadd231ps %zmm22, %zmm17, %zmm9
        vfmadd231ps %zmm22, %zmm18, %zmm10
        vfmadd231ps %zmm22, %zmm19, %zmm11
        vfmadd231ps %zmm23, %zmm16, %zmm12
        vfmadd231ps %zmm23, %zmm17, %zmm13
        vfmadd231ps %zmm23, %zmm18, %zmm14
        vfmadd231ps %zmm23, %zmm19, %zmm15
        .endr
        zrp  vshuff64x2, 0x44, 0xEE, 0, 0, 1, 24    // w = 8, its first step
        zred_rest
        .endm

/* zscores es, p0, d0, ..., p3, d3: the group's scores (es = 2: zgroup_h) into the scratch rows */
        .macro  zscores es, p0, d0, p1, d1, p2, d2, p3, d3
        .if \es == 4
        zgroup      \p0, \d0, \p1, \d1, \p2, \d2, \p3, \d3
        .else
        zgroup_h    \p0, \d0, \p1, \d1, \p2, \d2, \p3, \d3
        .endif
        vmovups     %xmm0, (%rax)
        vextractf32x4 $1, %zmm0, (%rax,%r10)
        vextractf32x4 $2, %zmm0, (%rax,%r12)
        vextractf32x4 $3, %zmm0, (%rax,%r13)
        .endm

/*
 * zpv es, first
 *   o_r = fma(p_r[t], v_t, o_r) for the rows r = first .. 3 and the 64 outputs: v_t at (%rsi) into
 *   zmm16-19 (widened if binary16), p_r[t] at (%rax) + (0, r10, r12, r13) into zmm20+r, o_r in
 *   zmm4r .. 4r+3 (p the broadcast operand, v the other: p * v + o as pvq).
 */
        .macro  zpvfma p, o0, o1, o2, o3
        vfmadd231ps %zmm16, %zmm\p, %zmm\o0
        vfmadd231ps %zmm17, %zmm\p, %zmm\o1
        vfmadd231ps %zmm18, %zmm\p, %zmm\o2
        vfmadd231ps %zmm19, %zmm\p, %zmm\o3
        .endm

        .macro  zpv es, first
        .if \es == 4
        vmovups        0(%rsi), %zmm16
        vmovups       64(%rsi), %zmm17
        vmovups      128(%rsi), %zmm18
        vmovups      192(%rsi), %zmm19
        .else
        vcvtph2ps      0(%rsi), %zmm16
        vcvtph2ps     32(%rsi), %zmm17
        vcvtph2ps     64(%rsi), %zmm18
        vcvtph2ps     96(%rsi), %zmm19
        .endif
        .if \first == 0
        vbroadcastss (%rax), %zmm20
        zpvfma      20, 0, 1, 2, 3
        .endif
        .if \first <= 1
        vbroadcastss (%rax,%r10), %zmm21
        zpvfma      21, 4, 5, 6, 7
        .endif
        .if \first <= 2
        vbroadcastss (%rax,%r12), %zmm22
        zpvfma      22, 8, 9, 10, 11
        .endif
        vbroadcastss (%rax,%r13), %zmm23
        zpvfma      23, 12, 13, 14, 15
        .endm

        .macro  zldq p, r0, r1, r2, r3
        vmovups        0(\p), %zmm\r0
        vmovups       64(\p), %zmm\r1
        vmovups      128(\p), %zmm\r2
        vmovups      192(\p), %zmm\r3
        .endm

        /* registers: scores: zmm16-31 q, rsi k_t, rax scratch column t, r10 / r12 / r13 scratch
         * offsets of rows 1-3, r14 scratch row stride (bytes), r15 positions (nmax), rbx groups left,
         * rdi the binary16 buffer, rcx / rdx tail rows, r8 scratch, r9 n_pos, r11 math_avx512;
         * p.V: rsi v_t, rax p column, r15 positions left */
        .macro  attention_rows_avx512 name, es
function \name
        rows_enter  math_avx512
        zldq        %rdi, 16, 17, 18, 19           // q of rows 0-3 into zmm16-31
        zldq        %rcx, 20, 21, 22, 23
        zldq        %rbx, 24, 25, 26, 27
        zldq        %rbp, 28, 29, 30, 31
        .if \es == 2
        leaq        RL_BUF+63(%rsp), %rdi
        andq        $-64, %rdi                      // binary16: q of row r at 256 r (%rdi), for zgroup_h
        vstore      %rdi, 0, 64, zmm, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31
        .endif

        /* scores of every row at positions 0 .. nmax - 1, 4 per step */
        movq        %r8, %rax
        movq        %r15, %rbx
        shrq        $2, %rbx
        jz          2f
1:
        zscores     \es, %rsi, 0, %rsi, 64*\es, %rsi, 128*\es, %rsi, 192*\es
        addq        $16, %rax
        addq        $256*\es, %rsi
        decq        %rbx
        jnz         1b
2:
        movq        %r15, %rbx
        andq        $3, %rbx                        // 1..3 positions left: the missing ones repeat the
        jz          3f                              // last (no over-read)
        movq        %rsi, %rcx
        leaq        64*\es(%rsi), %rdx
        cmpq        $2, %rbx
        cmovaeq     %rdx, %rcx                      // position 1: t+1 if it exists, else t
        leaq        128*\es(%rsi), %rdx
        cmpq        $3, %rbx
        cmovbq      %rcx, %rdx                      // positions 2, 3: t+2 if it exists, else position 1
        zscores     \es, %rsi, 0, %rcx, 0, %rdx, 0, %rdx, 0
3:
        /* p = softmax(s) of row r over its n_pos + r scores, in place */
        movq        %r8, %rbx
        movq        %r9, %r15
        movq        RL_R(%rsp), %rax
        movq        %rax, RL_CNT(%rsp)
4:
        softmax_avx512 %rbx, %rbx, %r15, %r11, %rax, %r10, %rcx
        addq        %r14, %rbx
        incq        %r15
        decq        RL_CNT(%rsp)
        jnz         4b

        /* o = sum_t p_t v_t: the 4 rows' 64 outputs in zmm0-15, one pass */
        movq        RL_S1(%rsp), %r10
        movq        RL_S2(%rsp), %r12
        movq        RL_S3(%rsp), %r13
        movq        RL_V(%rsp), %rsi
        movq        %r8, %rax
        movq        %r9, %r15
        vclear  vpxord, zmm, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        rows_pv     zpv, \es
        movq        RL_OUT(%rsp), %rdi
        movq        RL_O1(%rsp), %rcx
        movq        RL_O2(%rsp), %rbx
        movq        RL_O3(%rsp), %rbp
        vstore  %rdi, 0, 64, zmm, 0, 1, 2, 3
        addq        %rdi, %rcx
        vstore  %rcx, 0, 64, zmm, 4, 5, 6, 7
        addq        %rdi, %rbx
        vstore  %rbx, 0, 64, zmm, 8, 9, 10, 11
        addq        %rdi, %rbp
        vstore  %rbp, 0, 64, zmm, 12, 13, 14, 15
        vclear  vpxord, zmm, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31
9:
        addq        $RL_LOC, %rsp
        pop_callee
        vzeroupper
        ret
endfunc
        .endm

        attention_rows_avx512 gpt2asm_attention_rows_f32_avx512, 4
        attention_rows_avx512 gpt2asm_attention_rows_f16_avx512, 2
