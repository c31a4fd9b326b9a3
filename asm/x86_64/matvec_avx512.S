/*
 * asm/x86_64/matvec_avx512.S -- tiled matrix-vector product, AVX-512F (fp16 weights; the fp32 kernel is
 * the AVX2 one, see gpt2asm_matvec_f32_avx512 below).
 *
 * Same contract and the same per-output operation sequence as matvec_avx2.S (docs/kernels.md,
 * gpt2asm_matvec_f32): per output o = 64t + j
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc);
 *     y[o] = acc + b[o]        (y[o] = acc when b is NULL)
 * so the outputs are bit-identical to the AVX2 variant.
 *
 * One tile's 64 sums are 4 zmm (zmm0-3), 4 FMA chains: enough at the rate the weights come from DRAM
 * (one zmm FMA per 32 bytes of fp16) -- the tiles are taken one after the other,
 * so the weights stream strictly in address order, one forward stream.  Taking tiles t and t+1 together
 * (8 chains, two forward streams n_in rows apart, the earlier form of this kernel) covered the FMA
 * latency for weights in cache but read DRAM at 0.87-0.94 of a plain read against 0.93-1.0 for one
 * stream (docs/notes.md "matvec (AVX-512)"); decode reads DRAM.  The row loop is unrolled by 4.
 * Only AVX-512F instructions are used, and only zmm0-3, 8-15 (nothing is left in zmm16-31, so the final
 * vzeroupper leaves no dirty upper state behind).
 *
 * Registers (the fp16 function):
 *     rdi  w: current row of the tile
 *     rsi  x (argument)        rdx  b (+64*tile_begin) or NULL        rcx  y (+64*tile_begin)
 *     r8   n_in                r9   tiles left       r10  x cursor     r11  row counter
 *     zmm0-3  the tile's sums  zmm8-11  x[i] broadcasts  zmm12-15  widened fp16 weights
 */
#include "asm.S"
#include "rows4.h"

/* ---------------------------------------------------------------------------------------------- */
/* shared pieces                                                                                   */

        /* common prologue: r9 = tile count, rdi/rdx/rcx advanced to tile_begin.
         * Jumps to \done when the range is empty.  \rb: log2 of the row size in bytes. */
        .macro  matvec_setup    rb, done
        movq    8(%rsp), %rax                   // tile_end
        subq    %r9, %rax                       // n tiles
        jbe     \done                           // tile_end <= tile_begin: nothing to do
        movq    %r9, %r10
        shlq    $8, %r10                        // 64 floats = 256 bytes of b / y per tile
        addq    %r10, %rcx                      // y += 64 * tile_begin
        testq   %rdx, %rdx
        jz      6f
        addq    %r10, %rdx                      // b += 64 * tile_begin (only if non-NULL)
6:
        movq    %r8, %r10
        imulq   %r9, %r10                       // tile_begin * n_in rows
        shlq    $\rb, %r10                      // ... * bytes per row
        addq    %r10, %rdi                      // w += tile_begin * n_in * row
        movq    %rax, %r9                       // tiles left
        .endm

        /* y[64t .. 64t+63] = acc + b[...] (or = acc when b is NULL), then b and y past the tile */
        .macro  store_acc
        testq   %rdx, %rdx
        jz      8f
        vmemop  vaddps, %rdx, 0, 64, zmm, 0,1,2,3
        addq    $256, %rdx
8:
        vstore  %rcx, 0, 64, zmm, 0,1,2,3
        addq    $256, %rcx
        .endm

        /* one fp16 row (128 bytes): widen 16 halves at a time exactly, then the same FMAs */
        .macro  row_f16 off, xb
        vwidenfma4  f16, zmm, %rdi, \off+0, 32, \xb, 0, 1, 2, 3
        .endm

        /* all n_in rows of the tile at rdi (\row: row_f16, \rs: row bytes); leaves rdi
         * just past its last row (= row 0 of the next tile), the sums in zmm0-3 */
        .macro  tile_rows row, rs
        rows4   %rsi, %r8, zmm
        \row    0*\rs, %zmm8
        \row    1*\rs, %zmm9
        \row    2*\rs, %zmm10
        \row    3*\rs, %zmm11
        addq    $4*\rs, %rdi
        rows4_next %r8, zmm
        \row    0, %zmm8
        addq    $\rs, %rdi
        addq    $4, %r10
        decq    %r11
        jnz     4b
5:
        .endm

        /* the whole kernel for one weight type (\rb = log2 \rs) */
        .macro  matvec_body row, rs, rb
        matvec_setup \rb, 9f
        .p2align 4
1:                                              // tile after tile, in address order
        vclear  vpxord, zmm, 0, 1, 2, 3         // acc = +0.0
        tile_rows \row, \rs
        store_acc
        decq    %r9
        jnz     1b
9:
        vzeroupper
        ret
        .endm

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_matvec_f32_avx512(const float *w, const float *x, const float *b, float *y,
 *                                size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   for t in tile_begin .. tile_end-1, j in 0..63, o = 64t + j:
 *       acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc)
 *       y[o] = b ? acc + b[o] : acc
 *   w: [n_tiles][n_in][64] floats, 64-byte aligned.  x, b, y: any alignment.
 *
 *   This is gpt2asm_matvec_f32_avx2 (a jump; every AVX-512 CPU has AVX2 and FMA): with the weights
 *   coming from DRAM, its 32-byte memory-operand FMAs (two per line) read at 0.98-1.0 of a plain read
 *   where this file's zmm form (one 64-byte FMA per line) read at 0.93-0.95, and with the line loaded
 *   apart from the FMA at 0.86-0.90 (docs/notes.md "matvec (AVX-512)").  The fp16 kernel below keeps zmm:
 *   its vcvtph2ps zmm loads 32 bytes.
 */
function gpt2asm_matvec_f32_avx512
#ifdef GPT2ASM_MACHO
        jmp     _gpt2asm_matvec_f32_avx2
#else
        jmp     gpt2asm_matvec_f32_avx2        // bound locally: plan_x86.S declares it .protected
#endif
endfunc

/*
 * void gpt2asm_matvec_f16_avx512(const uint16_t *w, const float *x, const float *b, float *y,
 *                                size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   as gpt2asm_matvec_f32_avx512 with w[t][i][j] binary16, widened exactly (vcvtph2ps) before the FMA:
 *       acc = fma((float)w[t][i][j], x[i], acc)
 *   w: [n_tiles][n_in][64] halves (128 bytes per row), 64-byte aligned.
 */
function gpt2asm_matvec_f16_avx512
        matvec_body row_f16, 128, 7
endfunc
