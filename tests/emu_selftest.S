/*
 * tests/emu_selftest.S -- a tiny shared object that exercises tests/avx512emu.py.
 *
 * Built by tests/test_avx512emu.py with `cc -shared -nostdlib -o emu_selftest.so emu_selftest.S`.
 * GNU as, AT&T syntax, System V AMD64 ABI.  Each *_avx512 function has an *_avx2 twin that computes
 * the very same bits with the very same operation order, so the AVX2 twin can run natively (ctypes)
 * and under emulation, and the AVX-512 one under emulation, and all three must agree bit for bit.
 */

        .macro  func name
        .text
        .p2align 5
        .globl  \name
        .type   \name, @function
\name:
        .endm

        .macro  endfunc name
        .size   \name, . - \name
        .endm

/* ------------------------------------------------------------------------------------------------
 * void st_fma_f32_avx512(const float *a, const float *b, float *c, size_t n);
 *   c[i] = fma(a[i], b[i], c[i]); a masked tail handles n % 16.
 */
func st_fma_f32_avx512
        xorl    %eax, %eax                      // i
        movq    %rcx, %r8
        andq    $-16, %r8                       // n rounded down to a multiple of 16
        jz      2f
1:      vmovups (%rdx,%rax,4), %zmm0
        vmovups (%rdi,%rax,4), %zmm1
        vfmadd231ps (%rsi,%rax,4), %zmm1, %zmm0 // zmm0 += zmm1 * b[i..i+15]
        vmovups %zmm0, (%rdx,%rax,4)
        addq    $16, %rax
        cmpq    %r8, %rax
        jb      1b
2:      subq    %rax, %rcx                      // tail: 0..15 elements
        jz      3f
        movl    $1, %r9d
        shll    %cl, %r9d
        decl    %r9d
        kmovw   %r9d, %k1                       // k1 = (1 << tail) - 1
        vmovups (%rdx,%rax,4), %zmm0{%k1}{z}
        vmovups (%rdi,%rax,4), %zmm1{%k1}{z}
        vfmadd231ps (%rsi,%rax,4), %zmm1, %zmm0{%k1}   // masked memory operand: no fault on masked lanes
        vmovups %zmm0, (%rdx,%rax,4){%k1}
3:      vzeroupper
        ret
endfunc st_fma_f32_avx512

/* void st_fma_f32_avx2(const float *a, const float *b, float *c, size_t n); same bits as above. */
func st_fma_f32_avx2
        xorl    %eax, %eax
        movq    %rcx, %r8
        andq    $-8, %r8
        jz      2f
1:      vmovups (%rdx,%rax,4), %ymm0
        vmovups (%rdi,%rax,4), %ymm1
        vfmadd231ps (%rsi,%rax,4), %ymm1, %ymm0
        vmovups %ymm0, (%rdx,%rax,4)
        addq    $8, %rax
        cmpq    %r8, %rax
        jb      1b
2:      cmpq    %rcx, %rax
        jae     3f
        vmovss  (%rdx,%rax,4), %xmm0
        vmovss  (%rdi,%rax,4), %xmm1
        vfmadd231ss (%rsi,%rax,4), %xmm1, %xmm0
        vmovss  %xmm0, (%rdx,%rax,4)
        incq    %rax
        jmp     2b
3:      vzeroupper
        ret
endfunc st_fma_f32_avx2

/* ------------------------------------------------------------------------------------------------
 * float st_sum_f32_avx512(const float *x, size_t n);
 *   16 lane sums (lane j adds x[16i + j] in order; zero-masked tail), then a fixed reduction tree:
 *   lanes j + (j+8), then j + (j+4), then j + (j+2), then j + (j+1).
 */
func st_sum_f32_avx512
        vxorps  %xmm0, %xmm0, %xmm0             // zeroes all of zmm0
        movq    %rsi, %rcx
        andq    $-16, %rcx
        xorl    %eax, %eax
        testq   %rcx, %rcx
        jz      2f
1:      vaddps  (%rdi,%rax,4), %zmm0, %zmm0
        addq    $16, %rax
        cmpq    %rcx, %rax
        jb      1b
2:      movq    %rsi, %rcx
        subq    %rax, %rcx
        jz      3f
        movl    $1, %edx
        shll    %cl, %edx
        decl    %edx
        kmovw   %edx, %k1
        vmovups (%rdi,%rax,4), %zmm1{%k1}{z}
        vaddps  %zmm1, %zmm0, %zmm0
3:      vextractf64x4 $1, %zmm0, %ymm1
        vaddps  %ymm1, %ymm0, %ymm0
        vextractf128 $1, %ymm0, %xmm1
        vaddps  %xmm1, %xmm0, %xmm0
        vmovhlps %xmm0, %xmm0, %xmm1
        vaddps  %xmm1, %xmm0, %xmm0
        vmovshdup %xmm0, %xmm1
        vaddss  %xmm1, %xmm0, %xmm0
        vzeroupper
        ret
endfunc st_sum_f32_avx512

/* float st_sum_f32_avx2(const float *x, size_t n); two ymm accumulators = the 16 lanes above. */
func st_sum_f32_avx2
        vxorps  %xmm0, %xmm0, %xmm0             // lanes 0-7
        vxorps  %xmm1, %xmm1, %xmm1             // lanes 8-15
        movq    %rsi, %rcx
        andq    $-16, %rcx
        xorl    %eax, %eax
        testq   %rcx, %rcx
        jz      2f
1:      vaddps  (%rdi,%rax,4), %ymm0, %ymm0
        vaddps  32(%rdi,%rax,4), %ymm1, %ymm1
        addq    $16, %rax
        cmpq    %rcx, %rax
        jb      1b
2:      movq    %rsi, %rcx
        subq    %rax, %rcx                      // tail r = 0..15
        jz      3f
        leaq    .Ltail_mask(%rip), %rdx         // 16 x -1 then 16 x 0: load at -r gives r ones
        negq    %rcx
        vmovdqu 64(%rdx,%rcx,4), %ymm2          // lanes i < r
        vmovdqu 96(%rdx,%rcx,4), %ymm3          // lanes i < r - 8
        leaq    (%rdi,%rax,4), %rdi
        vmaskmovps (%rdi), %ymm2, %ymm4         // masked lanes read as +0.0 and never fault
        vmaskmovps 32(%rdi), %ymm3, %ymm5
        vaddps  %ymm4, %ymm0, %ymm0
        vaddps  %ymm5, %ymm1, %ymm1
3:      vaddps  %ymm1, %ymm0, %ymm0
        vextractf128 $1, %ymm0, %xmm1
        vaddps  %xmm1, %xmm0, %xmm0
        vmovhlps %xmm0, %xmm0, %xmm1
        vaddps  %xmm1, %xmm0, %xmm0
        vmovshdup %xmm0, %xmm1
        vaddss  %xmm1, %xmm0, %xmm0
        vzeroupper
        ret
endfunc st_sum_f32_avx2

/* ------------------------------------------------------------------------------------------------
 * void st_f16_misc_avx512(const uint16_t *h, float *rev, float *flo, int32_t *shr, size_t n);
 *   n % 16 == 0.  For each block of 16 halves x = (float)h:
 *   rev = x reversed within the block (vpermps, index vector from .rodata, RIP-relative),
 *   flo = floor(x) (vrndscaleps), shr = ((int32_t)trunc(x)) >> 1 (vcvttps2dq, vpsrad).
 */
func st_f16_misc_avx512
        vmovdqu32 .Lrev16(%rip), %zmm5
        xorl    %eax, %eax
        testq   %r8, %r8
        jz      2f
1:      vcvtph2ps (%rdi,%rax,2), %zmm0
        vpermps %zmm0, %zmm5, %zmm1
        vmovups %zmm1, (%rsi,%rax,4)
        vrndscaleps $0x09, %zmm0, %zmm2         // round down, precision exception suppressed
        vmovups %zmm2, (%rdx,%rax,4)
        vcvttps2dq %zmm0, %zmm3
        vpsrad  $1, %zmm3, %zmm3
        vmovdqu32 %zmm3, (%rcx,%rax,4)
        addq    $16, %rax
        cmpq    %r8, %rax
        jb      1b
2:      vzeroupper
        ret
endfunc st_f16_misc_avx512

/* void st_f16_misc_avx2(const uint16_t *h, float *rev, float *flo, int32_t *shr, size_t n); */
func st_f16_misc_avx2
        vmovdqu .Lrev8(%rip), %ymm5
        xorl    %eax, %eax
        testq   %r8, %r8
        jz      2f
1:      vcvtph2ps (%rdi,%rax,2), %ymm0          // x[0:8]
        vcvtph2ps 16(%rdi,%rax,2), %ymm4        // x[8:16]
        vpermps %ymm4, %ymm5, %ymm1             // rev[0:8] = reverse(x[8:16])
        vmovups %ymm1, (%rsi,%rax,4)
        vpermps %ymm0, %ymm5, %ymm1             // rev[8:16] = reverse(x[0:8])
        vmovups %ymm1, 32(%rsi,%rax,4)
        vroundps $0x09, %ymm0, %ymm2
        vmovups %ymm2, (%rdx,%rax,4)
        vroundps $0x09, %ymm4, %ymm2
        vmovups %ymm2, 32(%rdx,%rax,4)
        vcvttps2dq %ymm0, %ymm3
        vpsrad  $1, %ymm3, %ymm3
        vmovdqu %ymm3, (%rcx,%rax,4)
        vcvttps2dq %ymm4, %ymm3
        vpsrad  $1, %ymm3, %ymm3
        vmovdqu %ymm3, 32(%rcx,%rax,4)
        addq    $16, %rax
        cmpq    %r8, %rax
        jb      1b
2:      vzeroupper
        ret
endfunc st_f16_misc_avx2

/* ------------------------------------------------------------------------------------------------
 * void st_cpuinfo(uint32_t out[8]);
 *   out = { cpuid(1).ecx, cpuid(7,0).ebx, cpuid(7,0).ecx, cpuid(7,0).edx, xcr0 lo, xcr0 hi, mxcsr,
 *           cpuid(1).edx }
 */
func st_cpuinfo
        pushq   %rbx
        movq    %rdi, %r8
        movl    $1, %eax
        xorl    %ecx, %ecx
        cpuid
        movl    %ecx, 0(%r8)
        movl    %edx, 28(%r8)
        movl    $7, %eax
        xorl    %ecx, %ecx
        cpuid
        movl    %ebx, 4(%r8)
        movl    %ecx, 8(%r8)
        movl    %edx, 12(%r8)
        xorl    %ecx, %ecx
        xgetbv
        movl    %eax, 16(%r8)
        movl    %edx, 20(%r8)
        stmxcsr 24(%r8)
        popq    %rbx
        ret
endfunc st_cpuinfo

/* ------------------------------------------------------------------------------------------------
 * void st_fma_loop_avx512(uint64_t iters);  10 instructions per iteration, 8 of them zmm FMAs.
 * void st_fma_loop_avx2(uint64_t iters);    the same with ymm.
 */
func st_fma_loop_avx512
        vxorps  %xmm0, %xmm0, %xmm0
        vmovaps %zmm0, %zmm1
        vmovaps %zmm0, %zmm2
        vmovaps %zmm0, %zmm3
        vmovaps %zmm0, %zmm4
        vmovaps %zmm0, %zmm5
        vmovaps %zmm0, %zmm6
        vmovaps %zmm0, %zmm7
        vmovaps %zmm0, %zmm8
        vmovaps %zmm0, %zmm9
        testq   %rdi, %rdi
        jz      2f
1:      vfmadd231ps %zmm8, %zmm9, %zmm0
        vfmadd231ps %zmm8, %zmm9, %zmm1
        vfmadd231ps %zmm8, %zmm9, %zmm2
        vfmadd231ps %zmm8, %zmm9, %zmm3
        vfmadd231ps %zmm8, %zmm9, %zmm4
        vfmadd231ps %zmm8, %zmm9, %zmm5
        vfmadd231ps %zmm8, %zmm9, %zmm6
        vfmadd231ps %zmm8, %zmm9, %zmm7
        decq    %rdi
        jnz     1b
2:      vzeroupper
        ret
endfunc st_fma_loop_avx512

func st_fma_loop_avx2
        vxorps  %xmm0, %xmm0, %xmm0
        vmovaps %ymm0, %ymm1
        vmovaps %ymm0, %ymm2
        vmovaps %ymm0, %ymm3
        vmovaps %ymm0, %ymm4
        vmovaps %ymm0, %ymm5
        vmovaps %ymm0, %ymm6
        vmovaps %ymm0, %ymm7
        vmovaps %ymm0, %ymm8
        vmovaps %ymm0, %ymm9
        testq   %rdi, %rdi
        jz      2f
1:      vfmadd231ps %ymm8, %ymm9, %ymm0
        vfmadd231ps %ymm8, %ymm9, %ymm1
        vfmadd231ps %ymm8, %ymm9, %ymm2
        vfmadd231ps %ymm8, %ymm9, %ymm3
        vfmadd231ps %ymm8, %ymm9, %ymm4
        vfmadd231ps %ymm8, %ymm9, %ymm5
        vfmadd231ps %ymm8, %ymm9, %ymm6
        vfmadd231ps %ymm8, %ymm9, %ymm7
        decq    %rdi
        jnz     1b
2:      vzeroupper
        ret
endfunc st_fma_loop_avx2

/* ------------------------------------------------------------------------------------------------
 * void st_matvec64_avx512(const float *w, const float *x, float *y, size_t n_in);
 *   y[j] = sum over i (in order, one fused multiply-add each) of x[i] * w[i][j], j < 64, with w stored
 *   [n_in][64]: the shape of one output tile of the GPT-2 matvec.  Per i: a broadcast and 4 zmm FMAs
 *   with memory operands, 8 instructions.
 * void st_matvec64_avx2(...);  the same with 8 ymm accumulators: the same bits.
 */
func st_matvec64_avx512
        vxorps  %xmm0, %xmm0, %xmm0
        vmovaps %zmm0, %zmm1
        vmovaps %zmm0, %zmm2
        vmovaps %zmm0, %zmm3
        xorl    %eax, %eax
        testq   %rcx, %rcx
        jz      2f
1:      vbroadcastss (%rsi,%rax,4), %zmm4
        vfmadd231ps (%rdi), %zmm4, %zmm0
        vfmadd231ps 64(%rdi), %zmm4, %zmm1
        vfmadd231ps 128(%rdi), %zmm4, %zmm2
        vfmadd231ps 192(%rdi), %zmm4, %zmm3
        addq    $256, %rdi
        incq    %rax
        cmpq    %rcx, %rax
        jb      1b
2:      vmovups %zmm0, (%rdx)
        vmovups %zmm1, 64(%rdx)
        vmovups %zmm2, 128(%rdx)
        vmovups %zmm3, 192(%rdx)
        vzeroupper
        ret
endfunc st_matvec64_avx512

func st_matvec64_avx2
        vxorps  %xmm0, %xmm0, %xmm0
        vxorps  %xmm1, %xmm1, %xmm1
        vxorps  %xmm2, %xmm2, %xmm2
        vxorps  %xmm3, %xmm3, %xmm3
        vxorps  %xmm5, %xmm5, %xmm5
        vxorps  %xmm6, %xmm6, %xmm6
        vxorps  %xmm7, %xmm7, %xmm7
        vxorps  %xmm8, %xmm8, %xmm8
        xorl    %eax, %eax
        testq   %rcx, %rcx
        jz      2f
1:      vbroadcastss (%rsi,%rax,4), %ymm4
        vfmadd231ps (%rdi), %ymm4, %ymm0
        vfmadd231ps 32(%rdi), %ymm4, %ymm1
        vfmadd231ps 64(%rdi), %ymm4, %ymm2
        vfmadd231ps 96(%rdi), %ymm4, %ymm3
        vfmadd231ps 128(%rdi), %ymm4, %ymm5
        vfmadd231ps 160(%rdi), %ymm4, %ymm6
        vfmadd231ps 192(%rdi), %ymm4, %ymm7
        vfmadd231ps 224(%rdi), %ymm4, %ymm8
        addq    $256, %rdi
        incq    %rax
        cmpq    %rcx, %rax
        jb      1b
2:      vmovups %ymm0, (%rdx)
        vmovups %ymm1, 32(%rdx)
        vmovups %ymm2, 64(%rdx)
        vmovups %ymm3, 96(%rdx)
        vmovups %ymm5, 128(%rdx)
        vmovups %ymm6, 160(%rdx)
        vmovups %ymm7, 192(%rdx)
        vmovups %ymm8, 224(%rdx)
        vzeroupper
        ret
endfunc st_matvec64_avx2

/* uint64_t st_read_k1(void);  the opmask register k1 as the function finds it. */
func st_read_k1
        kmovq   %k1, %rax
        ret
endfunc st_read_k1

/* ------------------------------------------------------------------------------------------------
 * void st_masked_load_avx512(const float *base, size_t off, size_t n, float out[16]);
 *   out = base[off .. off+n) then zeros (n <= 16); lanes >= n are masked off and must not fault.
 */
func st_masked_load_avx512
        movl    %edx, %r8d
        movl    $1, %eax
        shlxl   %r8d, %eax, %eax                // BMI2 (the emulated CPU has it)
        decl    %eax
        kmovw   %eax, %k1
        vmovups (%rdi,%rsi,4), %zmm0{%k1}{z}
        vmovups %zmm0, (%rcx)
        vzeroupper
        ret
endfunc st_masked_load_avx512

/* ------------------------------------------------------------------------------------------------
 * double st_sum_args(int64_t a1, ..., int64_t a8, double d, float f);
 *   sum(k * a_k) + d + f: a7 and a8 come on the stack, d in xmm0, f in xmm1.
 */
func st_sum_args
        movq    %rdi, %rax
        leaq    (%rax,%rsi,2), %rax
        imulq   $3, %rdx, %rdx
        addq    %rdx, %rax
        leaq    (%rax,%rcx,4), %rax
        imulq   $5, %r8, %r8
        addq    %r8, %rax
        imulq   $6, %r9, %r9
        addq    %r9, %rax
        imulq   $7, 8(%rsp), %rdx
        addq    %rdx, %rax
        movq    16(%rsp), %rdx
        leaq    (%rax,%rdx,8), %rax
        vcvtsi2sdq %rax, %xmm2, %xmm2
        vcvtss2sd %xmm1, %xmm1, %xmm1
        vaddsd  %xmm0, %xmm2, %xmm0
        vaddsd  %xmm1, %xmm0, %xmm0
        ret
endfunc st_sum_args

/* uint32_t st_load_const(void);  reads a constant through a pointer table: needs R_X86_64_RELATIVE. */
func st_load_const
        movq    .Lptr_table(%rip), %rax
        movl    (%rax), %eax
        ret
endfunc st_load_const

/* ------------------------------------------------------------------------------------------------
 * Misbehaving functions: the emulator must report each of them.
 */
func st_ud                                      // #UD
        nop
        ud2
        ret
endfunc st_ud

func st_clobber_rbx                             // breaks the ABI: rbx is callee-saved
        movl    $1, %ebx
        ret
endfunc st_clobber_rbx

func st_write_at                                // void st_write_at(float *p, ptrdiff_t i): p[i] = 1.0f
        movl    $0x3f800000, (%rdi,%rsi,4)
        ret
endfunc st_write_at

func st_read_at                                 // float st_read_at(const float *p, ptrdiff_t i)
        vmovss  (%rdi,%rsi,4), %xmm0
        ret
endfunc st_read_at

func st_store_to_code                           // writes into its own (read-only) code page
.Lhere: leaq    .Lhere(%rip), %rax
        movb    $0x90, (%rax)
        ret
endfunc st_store_to_code

func st_spin                                    // never returns
1:      jmp     1b
endfunc st_spin

/* ------------------------------------------------------------------------------------------------ */
        .section .rodata
        .p2align 6
.Lrev16:
        .long   15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0
.Lrev8:
        .long   7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0
.Ltail_mask:
        .long   -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1
        .long   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
.Lmagic:
        .long   0x600dcafe

        .section .data.rel.ro, "aw"
        .p2align 3
.Lptr_table:
        .quad   .Lmagic                         // an absolute address: R_X86_64_RELATIVE

        .section .note.GNU-stack, "", @progbits
