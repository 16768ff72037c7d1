/*
 * cast_cpu.h: CPU conversion kernels between the floating dtypes.
 *
 * One table per instruction set, indexed [destination][source] by dtype
 * number. Each table holds a contiguous kernel for every pair it accelerates
 * and NULL elsewhere; NULL falls back to the portable table, which has every
 * pair of floating dtypes (NULL there: no such conversion). All tables compute
 * the same function, bit for bit (fp_formats.h), which the tests check by
 * forcing each instruction set in turn on the same inputs.
 */
#ifndef AMPC_CAST_CPU_H
#define AMPC_CAST_CPU_H

#include <stdint.h>
#include "kernels/dtypes.h"
#include "kernels/layout.h"
#include "cpu/cpu_kernels.h"

typedef void (*ampc_cast_contig_fn)(const void *src, void *dst, int64_t n);
typedef void (*ampc_cast_strided_fn)(const char *src, int64_t src_stride,
                                     char *dst, int64_t dst_stride, int64_t n);

typedef struct {
    const char *name;
    ampc_cast_contig_fn contig[AMPC_NUM_DTYPES][AMPC_NUM_DTYPES]; /* [dst][src] */
    /* The same with non-temporal stores, for outputs far larger than the
     * caches: they skip reading each destination line before writing it. */
    ampc_cast_contig_fn streaming[AMPC_NUM_DTYPES][AMPC_NUM_DTYPES];
} ampc_cast_table;

typedef enum {
    AMPC_ISA_PORTABLE = 0,
    AMPC_ISA_AVX2,        /* AVX2 + F16C */
    AMPC_ISA_AVX512,      /* AVX-512 F/BW/VL */
    AMPC_ISA_AVX512BF16,  /* AVX-512 plus the AVX512-BF16 conversion instruction */
    AMPC_ISA_COUNT
} ampc_isa;

/* The portable kernels: every pair of floating dtypes, contiguous and
 * strided; strided also from integer and bool to each floating dtype
 * (torch's conversions). [dst][src]; NULL: no such kernel. */
extern const ampc_cast_table ampc_cast_portable;
extern const ampc_cast_strided_fn ampc_cast_strided[AMPC_NUM_DTYPES][AMPC_NUM_DTYPES];

/* The strided kernel for any source the CPU casts: the table's for two
 * floating dtypes; integer and bool sources to a floating dtype (torch's
 * conversions); a same-dtype copy of any dtype. NULL for anything else. */
ampc_cast_strided_fn ampc_cast_strided_any(ampc_dtype dst, ampc_dtype src);

/* The SIMD tables (defined empty where the compiler cannot build them). */
extern const ampc_cast_table ampc_cast_avx2;
extern const ampc_cast_table ampc_cast_avx512;
extern const ampc_cast_table ampc_cast_avx512bf16;

/* Run-time CPU detection (cpu_features.c). */
int ampc_isa_supported(ampc_isa isa);
ampc_isa ampc_isa_best(void);
const char *ampc_isa_name(ampc_isa isa);
const ampc_cast_table *ampc_isa_table(ampc_isa isa);
/* The unscale kernels that go with an instruction set. */
const ampc_unscale_table *ampc_isa_unscale_table(ampc_isa isa);
/* The instruction set casts use now: the best one, unless a test forced another. */
ampc_isa ampc_isa_active(void);
void ampc_isa_set_active(ampc_isa isa);

/* Convert loop->data[1] (dtype src) into loop->data[0] (dtype dst). Plain C,
 * no Python: the caller may release the GIL around it. Splits large loops
 * across ampc's threads. `fresh_output`: the destination was just allocated
 * and never touched. */
void ampc_cast_cpu(const ampc_loop *loop, ampc_dtype dst, ampc_dtype src, int fresh_output);

#endif /* AMPC_CAST_CPU_H */
