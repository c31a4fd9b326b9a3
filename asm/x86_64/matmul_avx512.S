/*
 * asm/x86_64/matmul_avx512.S -- batched (prefill) matrix-matrix products on the tiled weights, AVX-512F.
 *
 * Same contract, prototypes and per-(token, output) operation sequence as matmul_avx2.S
 * (docs/kernels.md, gpt2asm_matmul): each y[tok][o] is computed exactly like the matvec kernel would
 * for that token, so the outputs are bit-identical to the AVX2 variant and to T matvec calls.
 *
 * Blocking.  For each tile (64 outputs) in [tile_begin, tile_end), for each chunk of the tile's rows
 * (K-blocking, below: 256 KiB of weights at most), for each block of 6 tokens: 24 accumulators
 * (6 tokens x the tile's 64 outputs = 4 zmm) live in zmm0-23 while the chunk's rows stream by; each
 * row is loaded (and widened: vcvtph2ps) once into zmm24-27 and used by
 * 24 FMAs, one broadcast of X[tok][i] per token (zmm28-29).  So a tile streams from memory once, and
 * then from L2 once per block of 6 tokens, front to back.  A last block of 1..5 tokens runs the same
 * code with fewer accumulators.  The row loop is unrolled by 2.  AVX-512F instructions only.
 * zmm16-31 are used, and zeroed before returning (vzeroupper does not touch them), so no dirty upper
 * state is left behind.  (Correctness also runs under tests/avx512emu.py where the CPU has no AVX-512.)
 *
 * Registers:
 *     rdi  w: current tile                 rsi  X of the current token block
 *     rdx  ldx in bytes                    rcx  b (+64*tile) or NULL
 *     r8   y of the current token block, current tile       r9  ldy in bytes
 *     r12  n_in                                    r13  tokens left in this tile's pass
 *     r15  tiles left
 *     r10  weight cursor   r11  X cursor, tokens 0-2   rax  X cursor, tokens 3-5   rbx  row counter
 *     rbp  prefetch cursor of the later blocks of a small call: the next chunk (matmul_body.h)
 *     stack: see "stack frame" below
 */
#include "asm.S"

/* K-blocking: a tile is swept in chunks of rows of at most MATMUL_KC_BYTES of weights (n_in split
 * into equal chunks), so that the chunk's weights stay in L2 while every block of tokens reuses them; between chunks the sums are parked in y and reloaded (exact binary32 values: no
 * extra rounding), so the per-output operation sequence is unchanged.  Measured on Zen 4 (1 MiB L2),
 * 3072 x 768 fp32 at T = 512: 72 GFLOP/s unblocked (a 768 KiB tile), 80 with 256 KiB chunks. */
#ifndef MATMUL_KC_BYTES
#  define MATMUL_KC_BYTES 262144
#endif

/* Small calls (batched decode: MM_PF_MIN <= n_tokens <= MM_PF_TOK) prefetch (hints: they never fault and
 * change nothing; past the chunk or the range they run on harmlessly).  The first block of tokens of
 * each chunk of rows streams the chunk from DRAM while doing 8-24 FMAs per 64-byte line; at that density
 * the hardware prefetchers alone keep too few lines in flight (6 tokens: 0.85 of a plain read on Zen 5,
 * 8 tokens 0.71).  So that block also prefetches (prefetcht0) every line MM_PF_DIST bytes ahead of its
 * pair of rows: f32 from 4 tokens, f16 from 1 (below that the f32 stream is at the bus without it and
 * the hints cost 5 %).  The later blocks of the chunk run from L2 with DRAM idle; in f32 each of their
 * pairs of rows prefetches MM_PF_NEXT lines of the next chunk (rbp, from its start on), which keeps the
 * hardware prefetchers streaming it (16 tokens 13 % faster; f16, compute-bound there, is slower with it:
 * MM_PF_NEXT = 0).  docs/notes.md "matmul (AVX-512) at small batches".  Large calls (prefill) amortize
 * the first pass over many blocks of tokens. */
#ifndef MM_PF_TOK
#  define MM_PF_TOK 32
#endif
#ifndef MM_PF_DIST
#  define MM_PF_DIST 8192
#endif
#define DT_F32 0
#define DT_F16 1

        /* acc[a0..a3] = fma(w[0..3], xb, acc[a0..a3]): one token's 4 accumulators */
        .macro  mm_fma4 a0, a1, a2, a3, xb
        vfmadd231ps %zmm24, %zmm\xb, %zmm\a0
        vfmadd231ps %zmm25, %zmm\xb, %zmm\a1
        vfmadd231ps %zmm26, %zmm\xb, %zmm\a2
        vfmadd231ps %zmm27, %zmm\xb, %zmm\a3
        .endm

        /* one row of the tile (\woff bytes from r10) into zmm24-27, then the FMAs of \mt tokens */
        .macro  mm_row dt, mt, woff, xoff
        .if \dt == DT_F32
        vmovups     \woff(%r10), %zmm24
        vmovups     \woff+64(%r10), %zmm25
        vmovups     \woff+128(%r10), %zmm26
        vmovups     \woff+192(%r10), %zmm27
        .elseif \dt == DT_F16
        vcvtph2ps   \woff(%r10), %zmm24
        vcvtph2ps   \woff+32(%r10), %zmm25
        vcvtph2ps   \woff+64(%r10), %zmm26
        vcvtph2ps   \woff+96(%r10), %zmm27
        .endif
        vbroadcastss \xoff(%r11), %zmm28
        mm_fma4 0, 1, 2, 3, 28
        .if \mt >= 2
        vbroadcastss \xoff(%r11,%rdx), %zmm29
        mm_fma4 4, 5, 6, 7, 29
        .endif
        .if \mt >= 3
        vbroadcastss \xoff(%r11,%rdx,2), %zmm28
        mm_fma4 8, 9, 10, 11, 28
        .endif
        .if \mt >= 4
        vbroadcastss \xoff(%rax), %zmm29
        mm_fma4 12, 13, 14, 15, 29
        .endif
        .if \mt >= 5
        vbroadcastss \xoff(%rax,%rdx), %zmm28
        mm_fma4 16, 17, 18, 19, 28
        .endif
        .if \mt >= 6
        vbroadcastss \xoff(%rax,%rdx,2), %zmm29
        mm_fma4 20, 21, 22, 23, 29
        .endif
        .endm

        /* epilogue of one token: y[tok][0..63] = acc (+ b); r11 = &y[tok][tile] */
        .macro  mm_out dt, a0, a1, a2, a3, bias
        .if \bias
        vaddps  %zmm28, %zmm\a0, %zmm\a0        // y = acc + b
        vaddps  %zmm29, %zmm\a1, %zmm\a1
        vaddps  %zmm30, %zmm\a2, %zmm\a2
        vaddps  %zmm31, %zmm\a3, %zmm\a3
        .endif
        vmovups %zmm\a0, (%r11)
        vmovups %zmm\a1, 64(%r11)
        vmovups %zmm\a2, 128(%r11)
        vmovups %zmm\a3, 192(%r11)
        addq    %r9, %r11
        .endm

        .macro  mm_outs dt, mt, bias
        mm_out  \dt, 0, 1, 2, 3, \bias
        .if \mt >= 2
        mm_out  \dt, 4, 5, 6, 7, \bias
        .endif
        .if \mt >= 3
        mm_out  \dt, 8, 9, 10, 11, \bias
        .endif
        .if \mt >= 4
        mm_out  \dt, 12, 13, 14, 15, \bias
        .endif
        .if \mt >= 5
        mm_out  \dt, 16, 17, 18, 19, \bias
        .endif
        .if \mt >= 6
        mm_out  \dt, 20, 21, 22, 23, \bias
        .endif
        .endm

        /* move the \mt tokens' accumulators between registers and y (r11 = &y[token 0][tile], rows
         * r9 bytes apart): \load = 1 loads them (continuing the sums of the previous chunk of rows),
         * 0 stores them (the sums so far, exact binary32 values: nothing is rounded twice) */
        .macro  mm_acc1 load, a0, a1, a2, a3
        .if \load
        vmovups    (%r11), %zmm\a0
        vmovups  64(%r11), %zmm\a1
        vmovups 128(%r11), %zmm\a2
        vmovups 192(%r11), %zmm\a3
        .else
        vmovups %zmm\a0,    (%r11)
        vmovups %zmm\a1,  64(%r11)
        vmovups %zmm\a2, 128(%r11)
        vmovups %zmm\a3, 192(%r11)
        .endif
        addq    %r9, %r11
        .endm

        .macro  mm_accs mt, load
        mm_acc1 \load, 0, 1, 2, 3
        .if \mt >= 2
        mm_acc1 \load, 4, 5, 6, 7
        .endif
        .if \mt >= 3
        mm_acc1 \load, 8, 9, 10, 11
        .endif
        .if \mt >= 4
        mm_acc1 \load, 12, 13, 14, 15
        .endif
        .if \mt >= 5
        mm_acc1 \load, 16, 17, 18, 19
        .endif
        .if \mt >= 6
        mm_acc1 \load, 20, 21, 22, 23
        .endif
        .endm

        /* \pf = 1 (a chunk's first block): prefetch (prefetcht0) the lines MM_PF_DIST bytes past the pair
         * of rows at r10; \pf = 2 (its later blocks): MM_PF_NEXT lines of the next chunk at rbp, which
         * moves on */
        .macro  mm_pf pf
        .if \pf == 2
        .irp k, 0,1,2,3
        .if \k < MM_PF_NEXT
        prefetcht0 64*\k(%rbp)
        .endif
        .endr
        addq    $64*MM_PF_NEXT, %rbp
        .exitm
        .endif
        .if \pf
        .irp k, 0,1,2,3,4,5,6,7
        .if \k < 2*ROWB/64
        prefetcht0 MM_PF_DIST+64*\k(%r10)
        .endif
        .endr
        .endif
        .endm

        /* the current tile for a block of \mt tokens (\pf: prefetching, mm_pf) */
        .macro  mm_block dt, mt, pf=0
        cmpq    $0, KFIRST(%rsp)
        jne     .Lzero\@
        movq    %r8, %r11                       // a later chunk of rows: continue the sums
        mm_accs \mt, 1
        jmp     .Linit\@
.Lzero\@:
        .irp k, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23
        .if \k < 4*\mt
        vpxord  %zmm\k, %zmm\k, %zmm\k          // acc = +0.0
        .endif
        .endr
.Linit\@:
        movq    %rdi, %r10                      // weight cursor: row 0 of the tile
        movq    %rsi, %r11                      // X cursor, token 0
        .if \mt >= 4
        leaq    (%rsi,%rdx,2), %rax
        addq    %rdx, %rax                      // X cursor, token 3
        .endif
        movq    %r12, %rbx
        shrq    $1, %rbx                        // n_in / 2 pairs of rows
        jz      .Lodd\@
        .p2align 4
.Lrows\@:
        mm_row  \dt, \mt, 0, 0
        mm_pf   \pf
        mm_row  \dt, \mt, ROWB, 4
        addq    $2*ROWB, %r10
        addq    $8, %r11
        .if \mt >= 4
        addq    $8, %rax
        .endif
        decq    %rbx
        jnz     .Lrows\@
.Lodd\@:
        testq   $1, %r12
        jz      .Lend\@
        mm_row  \dt, \mt, 0, 0                  // the last row of an odd n_in
.Lend\@:
        cmpq    $0, KLAST(%rsp)
        jne     .Lepi\@
        movq    %r8, %r11                       // not the last chunk of rows: park the sums in y
        mm_accs \mt, 0
        jmp     .Ldone\@
.Lepi\@:
        movq    %r8, %r11                       // &y[token 0][tile]
        testq   %rcx, %rcx
        jz      .Lnob\@
        vmovups    0(%rcx), %zmm28
        vmovups   64(%rcx), %zmm29
        vmovups  128(%rcx), %zmm30
        vmovups  192(%rcx), %zmm31
        mm_outs \dt, \mt, 1
        jmp     .Ldone\@
.Lnob\@:
        mm_outs \dt, \mt, 0
.Ldone\@:
        .endm

        .macro  mm_exit
        .irp k, 16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vpxord  %zmm\k, %zmm\k, %zmm\k          // leave no state in zmm16-31
        .endr
        vzeroupper
        ret
        .endm

#include "matmul_body.h"

/*
 * void gpt2asm_matmul_f32_avx512(const float *w, const float *x, size_t ldx, const float *b, float *y,
 *                                size_t ldy, size_t n_tokens, size_t n_in,
 *                                size_t tile_begin, size_t tile_end);
 */
        .set    ROWB, 256
        .set    KCMAX, MATMUL_KC_BYTES / 256
        .if KCMAX < 1
        .error "MATMUL_KC_BYTES must be at least one row of weights"
        .endif
        .set    RB, 8
        .set    MM_PF_MIN, 4
        .set    MM_PF_NEXT, 2
function gpt2asm_matmul_f32_avx512
        matmul_body DT_F32
endfunc

/*
 * void gpt2asm_matmul_f16_avx512(const uint16_t *w, <as f32>);   w: binary16, widened exactly.
 */
        .set    ROWB, 128
        .set    KCMAX, MATMUL_KC_BYTES / 128
        .if KCMAX < 1
        .error "MATMUL_KC_BYTES must be at least one row of weights"
        .endif
        .set    RB, 7
        .set    MM_PF_MIN, 1
        .set    MM_PF_NEXT, 0
function gpt2asm_matmul_f16_avx512
        matmul_body DT_F16
endfunc
