/*
 * asm/x86_64/matmul_avx2.S -- batched (prefill) matrix-matrix products on the tiled weights, AVX2+FMA.
 *
 *     Y[t][o] = sum_i W[o][i] * X[t][i] (+ b[o]),   for T tokens t and the outputs o of a tile range
 *
 * with the weights in exactly the layout of the matvec kernels ([n_tiles][n_in][64], fp32 or fp16),
 * and EACH (token, output) pair computed with the operation sequence of the
 * corresponding matvec kernel (docs/kernels.md, gpt2asm_matmul):
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], X[tok][i], acc)
 *     y = acc + b[o]                                (y = acc when b is NULL)
 * so a prompt run through these kernels gives bit-for-bit the outputs of T single-token steps.
 *
 * Blocking.  For each tile (64 outputs) in [tile_begin, tile_end), for each chunk of the tile's rows
 * (K-blocking, below: 256 KiB of weights at most), for each block of 6 tokens, for each of the tile's
 * 4 strips of 16 outputs: 12 accumulators (6 tokens x 2 ymm) live in ymm0-11 while the strip's rows
 * stream by; each row's 16 weights are loaded (and widened: vcvtph2ps) once
 * into ymm12-13 and used by 12 FMAs, one broadcast of X[tok][i] per token (ymm14-15).  A tile is read
 * from memory once and then from L2 for every further block of tokens; the 6 token rows of X being
 * read stay in L1/L2.  A last block of 1..5 tokens runs the same code with fewer accumulators (no
 * reads or writes past token n_tokens-1).  The row loop is unrolled by 2.  Measured on Zen 4 at
 * 2.8 GHz (peak 2 x 8 x 2 = 32 flop/cycle = 90 GFLOP/s): 76-87 GFLOP/s at T = 512 on the 124M shapes,
 * both weight types (tests/test_kernels_matmul.py --bench).
 *
 * Registers:
 *     rdi  w: current tile                 rsi  X of the current token block
 *     rdx  ldx in bytes                    rcx  b (+64*tile) or NULL
 *     r8   y of the current token block, current tile       r9  ldy in bytes
 *     r12  n_in                                    r13  tokens left in this tile's pass
 *     r14  strip offset in bytes of y / b (0, 64, 128, 192)      r15  tiles left
 *     r10  weight cursor   r11  X cursor, tokens 0-2   rax  X cursor, tokens 3-5   rbx  row counter
 *     rbp  prefetch cursor (calls of <= MM_PF_TOK tokens: the next chunk of rows, below)
 *     stack: see "stack frame" below
 */
#include "asm.S"

/* K-blocking: a tile is swept in chunks of rows of at most MATMUL_KC_BYTES of weights (n_in split
 * into equal chunks), so that the chunk's weights stay in L2 while every block of tokens and every
 * strip reuses them; between chunks the sums are parked in y and reloaded (exact binary32 values: no
 * extra rounding), so the per-output operation sequence is unchanged.  Measured on Zen 4 (1 MiB L2),
 * 3072 x 768 fp32 at T = 512: 72 GFLOP/s unblocked (a 768 KiB tile), 80 with 256 KiB chunks. */
#ifndef MATMUL_KC_BYTES
#  define MATMUL_KC_BYTES 262144
#endif

/* Small calls (batched decode: n_tokens <= MM_PF_TOK) prefetch.  A strip pass reads 64 bytes (f16: 32) of
 * each row of the tile, so the 4 strips of a tile that is not in cache are 4 strided passes over DRAM
 * (stride one row), which the hardware prefetchers do not follow: 16-19 GMAC/s at 6-8 tokens against
 * ~45 for the AVX-512 kernel, whose one strip is the whole row.  So while the first block of tokens of a
 * chunk of rows runs, each pair of rows also prefetches (prefetcht1, into L2) 2 lines (f16: 1) of the
 * next chunk of rows -- the next tile's after a tile's last chunk (hints: never fault, change nothing) --
 * so the 4 strips together cover it and every later pass reads L2 (docs/notes.md "matmul (AVX2) at
 * small batches").  Large calls (prefill) amortize the first pass over many blocks of tokens. */
#ifndef MM_PF_TOK
#  define MM_PF_TOK 32
#endif
        .set    MM_PF_MIN, 1                    // every small call prefetches
        .set    MM_PF_NEXT, 0                   // only in a chunk's first block of tokens
        .set    MM_B8, 0                        // no blocks of 8 tokens (matmul_body.h)
#define DT_F32 0
#define DT_F16 1

        /* one row: the strip's 16 weights of row (\woff bytes from r10) into ymm12-13, then
         * acc[tok][k] = fma(w_k, X[tok][i], acc[tok][k]) for the \mt tokens (X at \xoff from the cursors) */
        .macro  mm_row dt, mt, woff, xoff
        .if \dt == DT_F32
        vmovups     \woff(%r10), %ymm12
        vmovups     \woff+32(%r10), %ymm13
        .elseif \dt == DT_F16
        vcvtph2ps   \woff(%r10), %ymm12
        vcvtph2ps   \woff+16(%r10), %ymm13
        .endif
        vbroadcastss \xoff(%r11), %ymm14
        vfmadd231ps %ymm12, %ymm14, %ymm0
        vfmadd231ps %ymm13, %ymm14, %ymm1
        .if \mt >= 2
        vbroadcastss \xoff(%r11,%rdx), %ymm15
        vfmadd231ps %ymm12, %ymm15, %ymm2
        vfmadd231ps %ymm13, %ymm15, %ymm3
        .endif
        .if \mt >= 3
        vbroadcastss \xoff(%r11,%rdx,2), %ymm14
        vfmadd231ps %ymm12, %ymm14, %ymm4
        vfmadd231ps %ymm13, %ymm14, %ymm5
        .endif
        .if \mt >= 4
        vbroadcastss \xoff(%rax), %ymm15
        vfmadd231ps %ymm12, %ymm15, %ymm6
        vfmadd231ps %ymm13, %ymm15, %ymm7
        .endif
        .if \mt >= 5
        vbroadcastss \xoff(%rax,%rdx), %ymm14
        vfmadd231ps %ymm12, %ymm14, %ymm8
        vfmadd231ps %ymm13, %ymm14, %ymm9
        .endif
        .if \mt >= 6
        vbroadcastss \xoff(%rax,%rdx,2), %ymm15
        vfmadd231ps %ymm12, %ymm15, %ymm10
        vfmadd231ps %ymm13, %ymm15, %ymm11
        .endif
        .endm

        /* epilogue of one token: y[tok][strip] = acc (+ b); r11 = &y[tok][strip] */
        .macro  mm_out dt, a0, a1, bias
        .if \bias
        vaddps  %ymm14, %ymm\a0, %ymm\a0        // y = acc + b
        vaddps  %ymm15, %ymm\a1, %ymm\a1
        .endif
        vmovups %ymm\a0, (%r11)
        vmovups %ymm\a1, 32(%r11)
        addq    %r9, %r11
        .endm

        .macro  mm_outs dt, mt, bias
        mm_out  \dt, 0, 1, \bias
        .if \mt >= 2
        mm_out  \dt, 2, 3, \bias
        .endif
        .if \mt >= 3
        mm_out  \dt, 4, 5, \bias
        .endif
        .if \mt >= 4
        mm_out  \dt, 6, 7, \bias
        .endif
        .if \mt >= 5
        mm_out  \dt, 8, 9, \bias
        .endif
        .if \mt >= 6
        mm_out  \dt, 10, 11, \bias
        .endif
        .endm

        /* move the \mt tokens' accumulators between registers and y (r11 = &y[token 0][strip], rows
         * r9 bytes apart): \load = 1 loads them (continuing the sums of the previous chunk of rows),
         * 0 stores them (the sums so far, exact binary32 values: nothing is rounded twice) */
        .macro  mm_acc1 load, a0, a1
        .if \load
        vmovups   (%r11), %ymm\a0
        vmovups 32(%r11), %ymm\a1
        .else
        vmovups %ymm\a0,   (%r11)
        vmovups %ymm\a1, 32(%r11)
        .endif
        addq    %r9, %r11
        .endm

        .macro  mm_accs mt, op, load
        mm_acc1 \load, 0, 1
        .if \mt >= 2
        mm_acc1 \load, 2, 3
        .endif
        .if \mt >= 3
        mm_acc1 \load, 4, 5
        .endif
        .if \mt >= 4
        mm_acc1 \load, 6, 7
        .endif
        .if \mt >= 5
        mm_acc1 \load, 8, 9
        .endif
        .if \mt >= 6
        mm_acc1 \load, 10, 11
        .endif
        .endm

        /* prefetch the next chunk's bytes for one pair of rows (rbp: the cursor); \pf = 0: nothing */
        .macro  mm_pf dt, pf
        .if \pf
        prefetcht1 (%rbp)
        .if \dt == DT_F32
        prefetcht1 64(%rbp)
        addq    $128, %rbp
        .else
        addq    $64, %rbp
        .endif
        .endif
        .endm

        /* one strip (16 outputs at byte offset r14 of the tile) for \mt tokens (\pf: prefetching) */
        .macro  mm_strip dt, mt, pf=0
        cmpq    $0, KFIRST(%rsp)
        jne     .Lzero\@
        leaq    (%r8,%r14), %r11                // a later chunk of rows: continue the sums
        mm_accs \mt, vmovups, 1                 // (stored unrounded-further: exact binary32)
        jmp     .Linit\@
.Lzero\@:
        .irp k, 0,1,2,3,4,5,6,7,8,9,10,11
        .if \k < 2*\mt
        vxorps  %ymm\k, %ymm\k, %ymm\k          // acc = +0.0
        .endif
        .endr
.Linit\@:
        movq    %r14, %r10
        .if \dt == DT_F16
        shrq    $1, %r10                        // 16 outputs = 32 bytes of fp16
        .endif
        addq    %rdi, %r10                      // weight cursor: row 0 of the strip
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
        mm_row  \dt, \mt, ROWB, 4
        mm_pf   \dt, \pf
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
        leaq    (%r8,%r14), %r11                // not the last chunk of rows: park the sums in y
        mm_accs \mt, vmovups, 0
        jmp     .Ldone\@
.Lepi\@:
        leaq    (%r8,%r14), %r11                // &y[token 0][strip]
        testq   %rcx, %rcx
        jz      .Lnob\@
        vmovups   (%rcx,%r14), %ymm14
        vmovups 32(%rcx,%r14), %ymm15
        mm_outs \dt, \mt, 1
        jmp     .Ldone\@
.Lnob\@:
        mm_outs \dt, \mt, 0
.Ldone\@:
        .endm

        /* the 4 strips of the current tile for a block of \mt tokens (\pf: the block that prefetches) */
        .macro  mm_block dt, mt, pf=0
        xorl    %r14d, %r14d
        .p2align 4
.Lstrip\@:
        mm_strip \dt, \mt, \pf
        addq    $64, %r14
        cmpq    $256, %r14
        jb      .Lstrip\@
        .endm

        .macro  mm_exit
        vzeroupper
        ret
        .endm

#include "matmul_body.h"

/*
 * void gpt2asm_matmul_f32_avx2(const float *w, const float *x, size_t ldx, const float *b, float *y,
 *                              size_t ldy, size_t n_tokens, size_t n_in,
 *                              size_t tile_begin, size_t tile_end);
 *   y[t*ldy + o] = acc + b[o] (acc as gpt2asm_matvec_f32 with x = x + t*ldx), t < n_tokens,
 *   64*tile_begin <= o < 64*tile_end.   w: [n_tiles][n_in][64] fp32, 64-byte aligned.
 */
        .set    ROWB, 256
        .set    KCMAX, MATMUL_KC_BYTES / 256
        .if KCMAX < 1
        .error "MATMUL_KC_BYTES must be at least one row of weights"
        .endif
        .set    RB, 8
function gpt2asm_matmul_f32_avx2
        matmul_body DT_F32
endfunc

/*
 * void gpt2asm_matmul_f16_avx2(const uint16_t *w, <as f32>);   w: binary16, widened exactly.
 */
        .set    ROWB, 128
        .set    KCMAX, MATMUL_KC_BYTES / 128
        .if KCMAX < 1
        .error "MATMUL_KC_BYTES must be at least one row of weights"
        .endif
        .set    RB, 7
function gpt2asm_matmul_f16_avx2
        matmul_body DT_F16
endfunc
