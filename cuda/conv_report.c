/*
 * conv_report.c: AMPC_CONV_DEBUG's lines (conv_report.h), kept until
 * ampc._C takes them: nothing in ampc's C prints (kernels/backend.h's rules,
 * tests/test_lint.py), so the lines reach stderr through Python's
 * sys.stderr, where a caller can redirect or capture them.
 *
 * One buffer for the process under its own lock (the convolutions run under
 * dnn.c's lock, the taking does not). It is bounded, so that lines nobody
 * takes cannot grow it without end: one plan's lines come to 32 KB at most
 * (64 engine lines and 16 algorithm lines, each under 440 bytes), and
 * ampc.nn takes them after every convolution. A line that does not fit is
 * left out and counted, and the count is said in a last line.
 */
#include "conv_report.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOTICE_ROOM 128  /* kept free for the line that counts the lines left out */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char text[AMPC_CONV_REPORT_SIZE - NOTICE_ROOM];
static size_t used;            /* the bytes kept: at most sizeof text - 1 */
static unsigned long left_out; /* lines that did not fit since the last take */

int ampc_conv_debugging(void) { return getenv("AMPC_CONV_DEBUG") != NULL; }

void ampc_conv_debug_line(const char *fmt, ...)
{
    pthread_mutex_lock(&lock);
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(text + used, sizeof text - used, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof text - used)
        used += (size_t)n;
    else
        left_out++;  /* what vsnprintf wrote of it lies past `used`: never taken */
    pthread_mutex_unlock(&lock);
}

int ampc_cuda_conv_report(char *buf, size_t size, size_t *length)
{
    pthread_mutex_lock(&lock);
    char notice[NOTICE_ROOM] = "";
    if (left_out > 0)
        snprintf(notice, sizeof notice, "ampc conv: %lu more lines left out (AMPC_CONV_DEBUG's %zu bytes were "
                 "full)\n", left_out, sizeof text);
    const size_t tail = strlen(notice);
    *length = used + tail;
    if (buf != NULL && size > *length) {
        memcpy(buf, text, used);
        memcpy(buf + used, notice, tail + 1);
        used = 0;
        left_out = 0;
    }
    pthread_mutex_unlock(&lock);
    return AMPC_OK;
}
