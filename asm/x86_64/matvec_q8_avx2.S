/*
 * asm/x86_64/matvec_q8_avx2.S -- tiled matrix-vector product with int8 weights, AVX2 + FMA.
 *
 * Weight-only symmetric quantisation (docs/kernels.md, gpt2asm_matvec_q8): the weights are int8, tiled
 * [n_tiles][n_in][64] like the fp32 ones (one 64-byte row = one cache line per input of a tile), with
 * one fp32 scale per output.  The 64 sums of a tile live in ymm0-ymm7 for the whole stream, exactly as
 * in matvec_avx2.S; each row is widened in registers: vpmovsxbd (8 bytes -> 8 int32, straight from
 * memory) and vcvtdq2ps (exact: |w| <= 128 < 2^24), then the same memory-order FMA as the fp32 kernel.
 * Per 8 weights that is 3 instructions (load+extend, convert, FMA) on three different pipe groups.
 * Measured on Zen 4 (2.8 GHz, in L1, cycles per 8 weights): this sequence 1.00 (the FMA alone 0.5,
 * the extend + convert alone 0.67: the three share the 4 FP pipes, vpmovsxbd competes with both
 * others); one 32-byte load + register extends (vpshufd / vextracti128 + vpmovsxbd) 1.25; the 2^23
 * magic-number conversion (vpmovzxbd of w^0x80, vpor, vsubps) 1.19.  1.00 cycle per 8 bytes is
 * ~22 GB/s per core at 2.8 GHz, above the DRAM stream of one core on the CI machines (~15 GB/s).
 *
 * Per output o = 64t + j the operation sequence is exactly the contract's:
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], x[i], acc);
 *     p = acc * scale[o];   y[o] = p + b[o]        (y[o] = p when b is NULL)
 * and it is the same in matvec_q8_avx512.S (and in the prefill kernels matmul_*.S), so all of them
 * give bit-identical outputs.
 *
 * Registers:
 *     rdi  w: current weight row       rsi  scale (+64*tile_begin)      rdx  x (argument)
 *     rcx  b (+64*tile_begin) or NULL  r8   y (+64*tile_begin)          r9   n_in
 *     rax  tiles left                  r10  x cursor                    r11  row counter
 *     ymm0-7  the 64 accumulators      ymm8-11 x[i] broadcasts          ymm12-15 widened weights
 */
#include "asm.S"
#include "rows4.h"

/* Software prefetch distance in bytes (0: off).  As for the fp32 kernel, the hardware prefetchers
 * follow the single forward stream; measured on Zen 4 with the weights in DRAM, prefetcht0 of every
 * line 256 .. 4096 bytes ahead gained nothing reproducible (and 768+ lost up to 20 %), so it is off;
 * kept as a knob (-DQ8_PF_DIST=512) for other microarchitectures. */
#ifndef Q8_PF_DIST
#  define Q8_PF_DIST 0
#endif

        /* one int8 row (64 bytes at \off(%rdi)): acc[k] = fma((float)w[8k .. 8k+7], xb, acc[k]) */
        .macro  row_q8 off, xb
#if Q8_PF_DIST
        prefetcht0 Q8_PF_DIST+\off(%rdi)
#endif
        vwidenfma4  i8, ymm, %rdi, \off+0, 8, \xb, 0, 1, 2, 3
        vwidenfma4  i8, ymm, %rdi, \off+32, 8, \xb, 4, 5, 6, 7
        .endm

/*
 * void gpt2asm_matvec_q8_avx2(const int8_t *w, const float *scale, const float *x, const float *b,
 *                             float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   for t in tile_begin .. tile_end-1, j in 0..63, o = 64t + j:
 *       acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], x[i], acc)
 *       p = acc * scale[o];  y[o] = b ? p + b[o] : p
 *   w: [n_tiles][n_in][64] int8, 64-byte aligned.  scale, x, b, y: any alignment.
 */
function gpt2asm_matvec_q8_avx2
        movq    8(%rsp), %r10                   // tile_begin
        movq    16(%rsp), %rax                  // tile_end
        subq    %r10, %rax                      // tiles
        jbe     9f
        movq    %r10, %r11
        shlq    $8, %r11                        // 64 floats = 256 bytes of scale / b / y per tile
        addq    %r11, %rsi
        addq    %r11, %r8
        testq   %rcx, %rcx
        jz      6f
        addq    %r11, %rcx                      // b += 64 * tile_begin (only if non-NULL)
6:
        imulq   %r9, %r10                       // tile_begin * n_in rows
        shlq    $6, %r10                        // ... * 64 bytes
        addq    %r10, %rdi
        .p2align 4
1:                                              // for each tile
        vzero   0, 1, 2, 3, 4, 5, 6, 7          // acc = +0.0
        rows4   %rdx, %r9, ymm
        row_q8  0,   %ymm8
        row_q8  64,  %ymm9
        row_q8  128, %ymm10
        row_q8  192, %ymm11
        addq    $256, %rdi
        rows4_next %r9, ymm
        row_q8  0, %ymm8
        addq    $64, %rdi
        addq    $4, %r10
        decq    %r11
        jnz     4b
5:                                              // rdi now points at the next tile
        vmemop  vmulps, %rsi, 0, 32, ymm, 0,1,2,3,4,5,6,7  // p = acc * scale
        addq    $256, %rsi
        testq   %rcx, %rcx
        jz      8f
        vmemop  vaddps, %rcx, 0, 32, ymm, 0,1,2,3,4,5,6,7  // y = p + b
        addq    $256, %rcx
8:
        vstore  %r8, 0, 32, ymm, 0,1,2,3,4,5,6,7
        addq    $256, %r8
        decq    %rax
        jnz     1b
9:
        vzeroupper
        ret
endfunc
