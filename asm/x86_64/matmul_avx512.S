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
 * Binary16 takes the tokens in blocks of 8 first (MM_B8; then 6, then 1..5): a block of 8 sweeps the
 * chunk twice, once per half of the tile (8 tokens x 32 outputs = 16 accumulators, zmm0-15; the half
 * row widened into zmm24-25, broadcasts zmm28-31): per row 32 FMAs and 4 widenings, against 6 + 2
 * tokens' 32 FMAs, 8 widenings and a 2-token block bound by its 8 FMA chains' latency.
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
 *     r14  X cursor, tokens 6-7 (blocks of 8)
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
 * the first pass over many blocks of tokens.
 * On Zen 4 the fp32 hints cost more than they give: gpt2asm_matmul_f32_avx512_zen4 is the kernel without
 * them (MM_PF_FIRST = MM_PF_NEXT = 0): a B = 8 step's matmuls 27-28 -> 21-22 ms (docs/notes.md "fp32
 * batched decode on Zen 4: no prefetch hints").
 * A small binary16 call with a block of 8 (8 <= n_tokens <= MM_PF_TOK) takes its rows in chunks of
 * MM_KC_B8 bytes instead (64 rows; the sums parked in y between chunks as in K-blocking): the first
 * half's pass of a chunk prefetches MM_PF_DIST bytes on (the next chunk), so DRAM streams it while
 * both passes run.  One long pass per half left DRAM idle during the second (read / kernel 0.55
 * against the 6 + 2 blocks' 0.65); 8 KiB chunks 0.64-0.69 (docs/notes.md "binary16 blocks of 8"). */
#ifndef MM_PF_TOK
#  define MM_PF_TOK 32
#endif
#ifndef MM_KC_B8
#  define MM_KC_B8 8192
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
         * of rows at r10 (if MM_PF_FIRST: not in the Zen 4 fp32 variant); \pf = 2 (its later blocks):
         * MM_PF_NEXT lines of the next chunk at rbp, which moves on */
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
        .if \pf && MM_PF_FIRST
        .irp k, 0,1,2,3,4,5,6,7
        .if \k < 2*ROWB/64
        prefetcht0 MM_PF_DIST+64*\k(%r10)
        .endif
        .endr
        .endif
        .endm

        /* the row loop of a block: weight cursor r10 from the tile (rdi), X cursors from rsi for tokens 0,
         * 3, 6 (r11, rax, r14: the first \ncur of them), the chunk's n_in rows in pairs (unrolled by 2,
         * mm_pf \pf between the two), then the last row of an odd n_in; \row: the row macro with its first
         * arguments (mm_row dt, mt or mm_row8 dt, h), the row's offset and X's offset appended */
        .macro  mm_rows pf, ncur, row:vararg
        movq    %rdi, %r10                      // weight cursor: row 0 of the tile
        movq    %rsi, %r11                      // X cursor, token 0
        .if \ncur >= 2
        leaq    (%rsi,%rdx,2), %rax
        addq    %rdx, %rax                      // X cursor, token 3
        .endif
        .if \ncur >= 3
        leaq    (%rax,%rdx,2), %r14
        addq    %rdx, %r14                      // X cursor, token 6
        .endif
        movq    %r12, %rbx
        shrq    $1, %rbx                        // n_in / 2 pairs of rows
        jz      .Lodd\@
        .p2align 4
.Lrows\@:
        \row, 0, 0
        mm_pf   \pf
        \row, ROWB, 4
        addq    $2*ROWB, %r10
        addq    $8, %r11
        .if \ncur >= 2
        addq    $8, %rax
        .endif
        .if \ncur >= 3
        addq    $8, %r14
        .endif
        decq    %rbx
        jnz     .Lrows\@
.Lodd\@:
        testq   $1, %r12
        jz      .Lend\@
        \row, 0, 0                              // the last row of an odd n_in
.Lend\@:
        .endm

        /* the current tile for a block of \mt tokens (\pf: prefetching, mm_pf) */
        .macro  mm_block dt, mt, pf=0
        .if \mt == 8                            // 8 tokens: the two halves of the tile in turn
        mm_half8 \dt, 0, \pf                    // the first half's pass streams the chunk (prefetching)
        .if \pf == 1
        mm_half8 \dt, 1, 0                      // the second reads it from L1 / L2
        .else
        mm_half8 \dt, 1, \pf
        .endif
        .exitm
        .endif
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
        .if \mt >= 4
        mm_rows \pf, 2, mm_row \dt, \mt
        .else
        mm_rows \pf, 1, mm_row \dt, \mt
        .endif
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

        /* one token of a block of 8: X[tok][i] at \addr broadcast into zmm\xb, then its 2 sums
         * acc[a0], acc[a1] = fma(w half row (zmm24, zmm25), x, acc) */
        .macro  mm_bfma2 xb, a0, a1, addr:vararg
        vbroadcastss \addr, %zmm\xb
        vfmadd231ps %zmm24, %zmm\xb, %zmm\a0
        vfmadd231ps %zmm25, %zmm\xb, %zmm\a1
        .endm

        /* binary16, 8 tokens on one half of the tile (\h = 0: outputs 0-31, 1: 32-63): 2 accumulators a
         * token, token t in zmm(2t), zmm(2t+1); one row's half (\woff bytes from r10) widened into
         * zmm24-25, broadcasts round robin in zmm28-31; X cursors r11 (tokens 0-2), rax (3-5), r14 (6-7).
         * Per (token, output) the FMA of mm_row: the same operation and operand order, so the same bits. */
        .macro  mm_row8 dt, h, woff, xoff
        .if \dt != DT_F16
        .error "blocks of 8 tokens are binary16 only (MM_B8)"
        .endif
        vcvtph2ps   \woff+64*\h(%r10), %zmm24
        vcvtph2ps   \woff+64*\h+32(%r10), %zmm25
        mm_bfma2 28, 0, 1, \xoff(%r11)
        mm_bfma2 29, 2, 3, \xoff(%r11,%rdx)
        mm_bfma2 30, 4, 5, \xoff(%r11,%rdx,2)
        mm_bfma2 31, 6, 7, \xoff(%rax)
        mm_bfma2 28, 8, 9, \xoff(%rax,%rdx)
        mm_bfma2 29, 10, 11, \xoff(%rax,%rdx,2)
        mm_bfma2 30, 12, 13, \xoff(%r14)
        mm_bfma2 31, 14, 15, \xoff(%r14,%rdx)
        .endm

        /* token t's 2 accumulators (zmm\a0, zmm\a1) of half \h from (\load = 1) or to (0) y at r11 */
        .macro  mm_pair8 load, h, a0, a1
        .if \load
        vmovups 128*\h(%r11), %zmm\a0
        vmovups 128*\h+64(%r11), %zmm\a1
        .else
        vmovups %zmm\a0, 128*\h(%r11)
        vmovups %zmm\a1, 128*\h+64(%r11)
        .endif
        addq    %r9, %r11
        .endm

        /* the 8 tokens' accumulators of half \h from / to y (rows r9 bytes apart from r11) */
        .macro  mm_pairs8 load, h
        mm_pair8 \load, \h, 0, 1
        mm_pair8 \load, \h, 2, 3
        mm_pair8 \load, \h, 4, 5
        mm_pair8 \load, \h, 6, 7
        mm_pair8 \load, \h, 8, 9
        mm_pair8 \load, \h, 10, 11
        mm_pair8 \load, \h, 12, 13
        mm_pair8 \load, \h, 14, 15
        .endm

        /* one half (\h) of the current tile for the block of 8 tokens (\pf as mm_block) */
        .macro  mm_half8 dt, h, pf
        movq    %r8, %r11
        cmpq    $0, KFIRST(%rsp)
        jne     .Lzero\@
        mm_pairs8 1, \h                         // a later chunk of rows: continue the sums
        jmp     .Linit\@
.Lzero\@:
        vclear  vpxord, zmm, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15   // acc = +0.0
.Linit\@:
        mm_rows \pf, 3, mm_row8 \dt, \h
        movq    %r8, %r11                       // &y[token 0][tile]
        cmpq    $0, KLAST(%rsp)
        je      .Lpark\@
        testq   %rcx, %rcx
        jz      .Lpark\@
        vmovups 128*\h(%rcx), %zmm28
        vmovups 128*\h+64(%rcx), %zmm29
        .irp k, 0,2,4,6,8,10,12,14
        vaddps  %zmm28, %zmm\k, %zmm\k          // y = acc + b
        .endr
        .irp k, 1,3,5,7,9,11,13,15
        vaddps  %zmm29, %zmm\k, %zmm\k
        .endr
.Lpark\@:                                       // the outputs, or (not the last chunk) the sums so far
        mm_pairs8 0, \h
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
        .set    MM_PF_FIRST, 1
        .set    MM_PF_NEXT, 2
        .set    MM_B8, 0
function gpt2asm_matmul_f32_avx512
        matmul_body DT_F32
endfunc

/*
 * void gpt2asm_matmul_f32_avx512_zen4(<as gpt2asm_matmul_f32_avx512>);   the same bits.
 * The fp32 kernel without the small calls' prefetch hints: on Zen 4 (AVX-512 on a 256-bit datapath, where
 * the hardware prefetchers keep up with a block's 24 FMAs a row) the hints slowed the streaming first
 * block (6 tokens from DRAM: 0.80 of a plain read with them, 0.90 without) and the later blocks' hints of
 * the next chunk cost more still (8 tokens 0.55 -> 0.69-0.73).  Python passes its address in the plan's
 * fp32 MATMUL jobs (J_FN) on such a CPU (gpt2asm.kernels.matmul_variant).
 */
        .set    MM_PF_FIRST, 0
        .set    MM_PF_NEXT, 0
function gpt2asm_matmul_f32_avx512_zen4
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
        .set    MM_PF_FIRST, 1
        .set    MM_PF_NEXT, 0
        .set    MM_B8, 1
        .set    KCB8, MM_KC_B8 / 128
function gpt2asm_matmul_f16_avx512
        matmul_body DT_F16
endfunc

/*
 * void gpt2asm_matmul_f16_avx512_zen4(<as gpt2asm_matmul_f16_avx512>);   the same bits.
 * The binary16 kernel without blocks of 8 (tokens in blocks of 6, then 1..5, as fp32): for AVX-512 on a
 * 256-bit datapath (Zen 4, where a zmm FMA or widening takes both halves of a pipe).  There the two passes
 * of a block of 8 cost more than the 6 + 2 blocks' second widening: 124M, B = 8 decode step 28.8-33.0 ->
 * 23.1-23.5 ms, TTFT 512 920 -> 815 ms (docs/notes.md "binary16 on Zen 4: no blocks of 8").  Python
 * passes its address in the plan's f16 MATMUL jobs (J_FN) on such a CPU (gpt2asm.kernels).
 */
        .set    MM_B8, 0
function gpt2asm_matmul_f16_avx512_zen4
        matmul_body DT_F16
endfunc
