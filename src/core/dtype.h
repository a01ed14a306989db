/* core/dtype: element types of checkpoint tensors and their conversions. */
#ifndef SD_CORE_DTYPE_H
#define SD_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum sd_dtype {
    SD_DT_F32 = 0,
    SD_DT_F16,
    SD_DT_BF16,
    SD_DT_F8_E4M3, /* block-scaled weights: dequantized at load (core/safetensors.h) */
    SD_DT_I32,
    SD_DT_I64,
    SD_DT_U8,
    SD_DT_BOOL,
    SD_DT_COUNT
} sd_dtype;

static inline size_t sd_dtype_size(sd_dtype t)
{
    switch (t) {
    case SD_DT_F32: case SD_DT_I32: return 4;
    case SD_DT_F16: case SD_DT_BF16: return 2;
    case SD_DT_I64: return 8;
    default: return 1;
    }
}

static inline const char *sd_dtype_name(sd_dtype t)
{
    static const char *n[] = {"F32", "F16", "BF16", "F8_E4M3", "I32", "I64", "U8", "BOOL"};
    return (unsigned)t < SD_DT_COUNT ? n[t] : "?";
}

static inline float sd_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept quiet. */
static inline uint16_t sd_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float sd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t sd_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)h;
}

/* FP8 E4M3 ("fn": 4 exponent bits of bias 7, 3 mantissa bits, no
 * infinities, S.1111.111 NaN; 448 at most) as float: exact. */
static inline float sd_fp8_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t exp = (b >> 3) & 0xfu, man = b & 7u, u;
    if (exp == 15 && man == 7) {
        u = sign | 0x7fc00000u;
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal, man x 2^-9: normalize */
            int e = 0;
            while (!(man & 8u)) {
                man <<= 1;
                e++;
            }
            u = sign | ((uint32_t)(127 - 6 - e) << 23) | ((man & 7u) << 20);
        }
    } else {
        u = sign | ((exp + 127 - 7) << 23) | (man << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i of a buffer of type t, as float (F32/F16/BF16/F8_E4M3 only). */
static inline float sd_load_f32(const void *p, sd_dtype t, size_t i)
{
    switch (t) {
    case SD_DT_F32: return ((const float *)p)[i];
    case SD_DT_BF16: return sd_bf16_to_f32(((const uint16_t *)p)[i]);
    case SD_DT_F16: return sd_f16_to_f32(((const uint16_t *)p)[i]);
    case SD_DT_F8_E4M3: return sd_fp8_e4m3_to_f32(((const uint8_t *)p)[i]);
    default: return 0.0f;
    }
}

#endif
