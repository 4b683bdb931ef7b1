/* CRC-32C (Castagnoli), as the crc32c package and TensorFlow compute it, for ``_records.c``: the
 * processor's instruction where there is one (SSE 4.2 on x86-64, the CRC extension on 64-bit
 * ARM), else eight table lookups per eight bytes. ``crc32c_init`` chooses once, at import. */
#ifndef TFRFS_CRC32C_H
#define TFRFS_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u   /* the Castagnoli polynomial, bits reversed */
#define CRC_MASK_DELTA 0xA282EAD8u

static uint32_t crc_table[8][256];

/* ``crc`` (of the bytes before, as returned) carried over ``n`` more bytes: eight bytes a step
 * through eight tables. */
static uint32_t crc32c_tables(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
        w ^= crc;
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^ crc_table[5][(w >> 16) & 0xFF] ^
              crc_table[4][(w >> 24) & 0xFF] ^ crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC_HW 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
static int crc_hw_present(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#define CRC_HW 1
#include <arm_acle.h>
static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __crc32cd(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __crc32cb(c, *p++);
    return ~c;
}
static int crc_hw_present(void) { return 1; }
#endif

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static crc_fn crc32c = crc32c_tables;

/* Fills the tables and chooses the instruction where the processor has it; ``pure``: the tables
 * only (the tests check one against the other). */
static void crc32c_init(int pure) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    crc32c = crc32c_tables;
#ifdef CRC_HW
    if (!pure && crc_hw_present())
        crc32c = crc32c_hw;
#else
    (void)pure;
#endif
}

/* TFRecord's masked checksum of ``n`` bytes. */
static uint32_t masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + CRC_MASK_DELTA;
}

#endif
