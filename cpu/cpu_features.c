/*
 * cpu_features.c: which instruction sets this CPU and OS support, and which
 * conversion table the casts use.
 *
 * gcc's __builtin_cpu_supports also checks that the OS saves the wide
 * registers (XGETBV), so a feature it reports can be used.
 */
#include "cpu/cast_cpu.h"
#include "cpu/cpu_features.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AMPC_X86 1
#endif

int ampc_cpu_features(ampc_feature *out, int max)
{
    int n = 0;
#ifdef AMPC_X86
    __builtin_cpu_init();
#define FEATURE(label)                                                   \
    if (n < max) {                                                      \
        out[n].name = label;                                             \
        out[n].present = __builtin_cpu_supports(label) ? 1 : 0;         \
        n++;                                                            \
    }
    FEATURE("sse4.2")
    FEATURE("avx")
    FEATURE("f16c")
    FEATURE("fma")
    FEATURE("avx2")
    FEATURE("avx512f")
    FEATURE("avx512bw")
    FEATURE("avx512vl")
    FEATURE("avx512bf16")
    FEATURE("avx512fp16")
#undef FEATURE
#else
    (void)out;
    (void)max;
#endif
    return n;
}

int ampc_isa_supported(ampc_isa isa)
{
    switch (isa) {
    case AMPC_ISA_PORTABLE:
        return 1;
#ifdef AMPC_X86
    case AMPC_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
               __builtin_cpu_supports("fma");
    case AMPC_ISA_AVX512:
        return ampc_isa_supported(AMPC_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    case AMPC_ISA_AVX512BF16:
        return ampc_isa_supported(AMPC_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
#endif
    default:
        return 0;
    }
}

ampc_isa ampc_isa_best(void)
{
    for (int isa = AMPC_ISA_COUNT - 1; isa > AMPC_ISA_PORTABLE; isa--)
        if (ampc_isa_supported((ampc_isa)isa))
            return (ampc_isa)isa;
    return AMPC_ISA_PORTABLE;
}

static const ampc_cast_table *const tables[AMPC_ISA_COUNT] = {
    &ampc_cast_portable, &ampc_cast_avx2, &ampc_cast_avx512, &ampc_cast_avx512bf16,
};

const char *ampc_isa_name(ampc_isa isa) { return tables[isa]->name; }

const ampc_cast_table *ampc_isa_table(ampc_isa isa) { return tables[isa]; }

/* AVX512-BF16 changes only how casts round to bfloat16; unscale rounds the
 * same way with the AVX-512 kernels. */
static const ampc_unscale_table *const unscale_tables[AMPC_ISA_COUNT] = {
    &ampc_unscale_portable, &ampc_unscale_avx2, &ampc_unscale_avx512, &ampc_unscale_avx512,
};

const ampc_unscale_table *ampc_isa_unscale_table(ampc_isa isa) { return unscale_tables[isa]; }

int ampc_isa_from_name(const char *name)
{
    for (int isa = 0; isa < AMPC_ISA_COUNT; isa++)
        if (strcmp(name, tables[isa]->name) == 0)
            return isa;
    return -1;
}

/* -1: not chosen yet. Written by tests that force a table; atomic so a cast
 * running on another thread reads either the old or the new value. */
static int active_isa = -1;

ampc_isa ampc_isa_active(void)
{
    int isa = __atomic_load_n(&active_isa, __ATOMIC_RELAXED);
    if (isa < 0) {
        isa = (int)ampc_isa_best();
        __atomic_store_n(&active_isa, isa, __ATOMIC_RELAXED);
    }
    return (ampc_isa)isa;
}

void ampc_isa_set_active(ampc_isa isa) { __atomic_store_n(&active_isa, (int)isa, __ATOMIC_RELAXED); }
