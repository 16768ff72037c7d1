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

/* The dtypes, numbered as dtypes.def says. */
typedef enum {
#define AMPC_DTYPE(ENUM, VALUE, ...) AMPC_##ENUM = VALUE,
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
} ampc_dtype;

/* One more than the largest value (dtypes.def's rows have no gap). */
enum {
    AMPC_NUM_DTYPES = 0
#define AMPC_DTYPE(...) + 1
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
};

/* dtypes.def's KIND column. */
typedef enum {
    AMPC_KIND_FLOAT,         /* floating, and ampc computes in it */
    AMPC_KIND_STORED_FLOAT,  /* floating, only stored and cast (none yet; float8 next) */
    AMPC_KIND_BOOL,
    AMPC_KIND_INT,
    AMPC_KIND_UINT,
} ampc_dtype_kind;

/* Bit d set when dtype d is of kind FLOAT: the test below goes by the
 * table, not by position, so a dtype appended later counts for what it is. */
enum {
    AMPC_FLOAT_DTYPE_BITS = 0
#define AMPC_DTYPE(ENUM, VALUE, NAME, SIZE, KIND, ...) | (AMPC_KIND_##KIND == AMPC_KIND_FLOAT ? 1 << (VALUE) : 0)
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
};
#define AMPC_DTYPE_IS_FLOAT(d) ((unsigned)(d) < (unsigned)AMPC_NUM_DTYPES && (AMPC_FLOAT_DTYPE_BITS >> (unsigned)(d) & 1))

/* Bytes per element. */
static inline int64_t ampc_dtype_size(ampc_dtype d)
{
    switch (d) {
#define AMPC_DTYPE(ENUM, VALUE, NAME, SIZE, ...) case AMPC_##ENUM: return SIZE;
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
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
