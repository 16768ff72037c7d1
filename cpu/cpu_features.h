/* cpu_features.h: the CPU's SIMD features, for `ampc doctor` and the tests. */
#ifndef AMPC_CPU_FEATURES_H
#define AMPC_CPU_FEATURES_H

#include "kernels/backend.h"

/* Fill up to `max` entries; returns how many (0 on CPUs ampc has no SIMD
 * kernels for). */
int ampc_cpu_features(ampc_feature *out, int max);

/* The ampc_isa with this table name ("portable", "avx2", ...), or -1. */
int ampc_isa_from_name(const char *name);

#endif /* AMPC_CPU_FEATURES_H */
