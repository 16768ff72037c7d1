/*
 * dtypes.h: the plain-C vocabulary shared by ampc._C (src/) and
 * ampc._cuda (cuda/): dtypes, devices, limits. No Python, no CUDA here, so
 * both the host compiler and nvcc can include it.
 *
 * The enum values cross the boundary between the two extension modules, so
 * they are part of ampc's internal ABI: append, never renumber.
 */
#ifndef AMPC_KERNELS_DTYPES_H
#define AMPC_KERNELS_DTYPES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    /* The floating dtypes of mixed precision; ampc.cast converts between any two. */
    AMPC_FLOAT32 = 0,
    AMPC_FLOAT16 = 1,
    AMPC_BFLOAT16 = 2,
    AMPC_FLOAT64 = 3,
    /* Valid array dtypes that mixed precision never casts. */
    AMPC_BOOL = 4,
    AMPC_INT8 = 5,
    AMPC_INT16 = 6,
    AMPC_INT32 = 7,
    AMPC_INT64 = 8,
    AMPC_UINT8 = 9,
    AMPC_UINT16 = 10,
    AMPC_UINT32 = 11,
    AMPC_UINT64 = 12,
    AMPC_NUM_DTYPES
} ampc_dtype;

#define AMPC_NUM_FLOAT_DTYPES 4
#define AMPC_DTYPE_IS_FLOAT(d) ((unsigned)(d) < AMPC_NUM_FLOAT_DTYPES)

/* Bytes per element. */
static inline int64_t ampc_dtype_size(ampc_dtype d)
{
    switch (d) {
    case AMPC_FLOAT64: case AMPC_INT64: case AMPC_UINT64: return 8;
    case AMPC_FLOAT32: case AMPC_INT32: case AMPC_UINT32: return 4;
    case AMPC_FLOAT16: case AMPC_BFLOAT16: case AMPC_INT16: case AMPC_UINT16: return 2;
    default: return 1;
    }
}

typedef enum {
    AMPC_DEVICE_CPU = 0,
    AMPC_DEVICE_CUDA = 1,
} ampc_device_type;

typedef struct {
    ampc_device_type type;
    int index;  /* CUDA ordinal; 0 for the CPU */
} ampc_device;

/* NumPy's own limit on dimensions; DLPack tensors with more are refused. */
#define AMPC_MAX_NDIM 64

#ifdef __cplusplus
}
#endif

#endif /* AMPC_KERNELS_DTYPES_H */
