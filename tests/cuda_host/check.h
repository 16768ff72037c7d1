/*
 * check.h: the harnesses' one assertion: on failure, say where and what, and
 * exit 1 (tests/test_cuda_host.py then shows the output).
 */
#ifndef AMPC_TEST_CHECK_H
#define AMPC_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

#endif /* AMPC_TEST_CHECK_H */
