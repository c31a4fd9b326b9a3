/*
 * asm/x86_64/q0_const.h -- the constants of the q8_0 / q4_0 kernels (matvec_q0_*.S, matmul_q0_*.S).
 *
 *   q0_const NAME, VL    a read-only block NAME: int16 ones at Q0_ONES, bytes 0x80 at Q0_K80, bytes 0x0f at
 *                        Q0_M0F, 0x30 at Q0_M30; VL = 32: whole ymm vectors (192 bytes, the last
 *                        Q0_DUPW: the vpshufb pattern 0,1,0,1, 4,5,4,5, ...), VL = 64: one dword each, for
 *                        {1to16} / vpbroadcastd (32 bytes; q6_k: 0xf0 at Q0_MF0, 0x03 at
 *                        Q0_M03, the int16 pair (16, 0) at Q0_W16).
 */
#ifndef GPT2ASM_X86_Q0_CONST_H
#define GPT2ASM_X86_Q0_CONST_H

        .macro  q0_const name, vl
        .if \vl == 32
        .set    Q0_ONES, 0                      // int16 1
        .set    Q0_K80, 32                      // bytes 0x80
        .set    Q0_M0F, 64                      // bytes 0x0f
        .set    Q0_M30, 96                      // bytes 0x30 (q6_k: 16 * the high 2 bits)
        .set    Q0_DUPW, 128                    // vpshufb: word 0 of each dword into both words (q6_k)
const \name, 6
        .rept   16
        .short  1
        .endr
        .rept   32
        .byte   0x80
        .endr
        .rept   32
        .byte   0x0f
        .endr
        .rept   32
        .byte   0x30
        .endr
        .rept   2
        .byte   0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13
        .endr
endconst
        .else
        .set    Q0_ONES, 0                      // int16 1 (two per dword)
        .set    Q0_K80, 4                       // bytes 0x80
        .set    Q0_M0F, 8                       // bytes 0x0f
        .set    Q0_M30, 12                      // bytes 0x30 (q6_k)
        .set    Q0_MF0, 16                      // bytes 0xf0 (q6_k)
        .set    Q0_M03, 20                      // bytes 0x03 (q6_k)
        .set    Q0_W16, 24                      // the int16 pair (16, 0) (q6_k: vpdpwssd)
const \name, 5
        .long   0x00010001, 0x80808080, 0x0f0f0f0f, 0x30303030, 0xf0f0f0f0, 0x03030303, 0x00000010, 0
endconst
        .endif
        .endm

#endif /* GPT2ASM_X86_Q0_CONST_H */
