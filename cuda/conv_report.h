/*
 * conv_report.h: the lines AMPC_CONV_DEBUG asks of the convolutions, which
 * conv.c and conv_graph.c write here and ampc._C takes through the table's
 * conv_report (conv_report.c) for Python to print. Plain C, no CUDA.
 */
#ifndef AMPC_CUDA_CONV_REPORT_H
#define AMPC_CUDA_CONV_REPORT_H

#include <stddef.h>
#include "backend_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether AMPC_CONV_DEBUG is set (read on each call, as a setting made
 * after import must take effect). */
int ampc_conv_debugging(void);

/* Keep one formatted line (fmt ends with its newline). */
void ampc_conv_debug_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif

#endif /* AMPC_CUDA_CONV_REPORT_H */
