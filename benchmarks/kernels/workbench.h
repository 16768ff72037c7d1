/*
 * workbench.h: what the workbench programs beside it share. CHECK(call)
 * ends the program with the file, line and CUDA's message where a runtime
 * call fails: a workbench is a measurement, with nothing to recover.
 */
#ifndef AMPC_WORKBENCH_H
#define AMPC_WORKBENCH_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t e = (x);                                                                      \
        if (e != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));             \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#endif /* AMPC_WORKBENCH_H */
