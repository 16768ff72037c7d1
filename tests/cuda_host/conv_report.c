/*
 * cuda/conv_report.c on the CPU (tests/test_cuda_host.py): the lines kept,
 * measured, taken whole and forgotten; a buffer too small takes nothing; a
 * full buffer leaves whole lines out and says how many; lines from two
 * threads at once stay whole. Prints "ok <check>" per check passed.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "conv_report.h"
#include "check.h"

static char buf[AMPC_CONV_REPORT_SIZE];

/* Take what is kept into buf (all of it, or CHECK fails); its length. */
static size_t take(void)
{
    size_t length = 99;
    CHECK(ampc_cuda_conv_report(buf, sizeof buf, &length) == AMPC_OK);
    CHECK(length < sizeof buf && strlen(buf) == length);
    return length;
}

static size_t pending(void)
{
    size_t length = 99;
    CHECK(ampc_cuda_conv_report(NULL, 0, &length) == AMPC_OK);
    return length;
}

static void *writer(void *arg)
{
    for (int i = 0; i < 200; i++)
        ampc_conv_debug_line("thread %c line %03d %s\n", *(const char *)arg, i, "0123456789abcdefghij");
    return NULL;
}

int main(void)
{
    CHECK(pending() == 0 && take() == 0 && buf[0] == '\0');
    puts("ok empty");

    ampc_conv_debug_line("ampc conv: %s, %.4f ms\n", "forward", 1.5);
    ampc_conv_debug_line("b %d\n", 7);
    const char *want = "ampc conv: forward, 1.5000 ms\nb 7\n";
    CHECK(pending() == strlen(want) && pending() == strlen(want));  /* measuring takes nothing */
    size_t length = 0;
    memset(buf, 'x', 64);
    CHECK(ampc_cuda_conv_report(buf, strlen(want), &length) == AMPC_OK);  /* no room for the NUL */
    CHECK(length == strlen(want) && buf[0] == 'x' && pending() == strlen(want));
    CHECK(ampc_cuda_conv_report(buf, strlen(want) + 1, &length) == AMPC_OK);
    CHECK(length == strlen(want) && strcmp(buf, want) == 0);
    CHECK(pending() == 0 && take() == 0);
    puts("ok kept, measured, taken, forgotten");

    /* 100-byte lines: the buffer's AMPC_CONV_REPORT_SIZE - 128 bytes hold 654 whole ones */
    const int lines = 1000, fit = (int)((AMPC_CONV_REPORT_SIZE - 128 - 1) / 100);
    for (int i = 0; i < lines; i++)
        ampc_conv_debug_line("%099d\n", i);
    ampc_conv_debug_line("%s", "1234567\n");  /* the 8 bytes left: no room for its NUL */
    ampc_conv_debug_line("%s", "123456\n");   /* fits, to the last byte */
    length = take();
    char notice[128];
    snprintf(notice, sizeof notice, "ampc conv: %d more lines left out (AMPC_CONV_DEBUG's %d bytes were full)\n",
             lines - fit + 1, (int)AMPC_CONV_REPORT_SIZE - 128);
    CHECK(fit * 100 + 7 == AMPC_CONV_REPORT_SIZE - 128 - 1);
    CHECK(length == (size_t)fit * 100 + 7 + strlen(notice) && strncmp(buf + fit * 100, "123456\n", 7) == 0);
    CHECK(strcmp(buf + fit * 100 + 7, notice) == 0);
    for (int i = 0; i < fit; i++) {
        char line[101];
        snprintf(line, sizeof line, "%099d\n", i);
        CHECK(memcmp(buf + i * 100, line, 100) == 0);
    }
    ampc_conv_debug_line("after\n");  /* room again, and the count starts over */
    CHECK(take() == 6 && strcmp(buf, "after\n") == 0);
    puts("ok full: whole lines, the rest counted");

    pthread_t threads[2];
    const char names[2] = {'a', 'b'};
    for (int t = 0; t < 2; t++)
        CHECK(pthread_create(&threads[t], NULL, writer, (void *)&names[t]) == 0);
    for (int t = 0; t < 2; t++)
        CHECK(pthread_join(threads[t], NULL) == 0);
    length = take();
    int next[2] = {0, 0};
    for (char *line = buf; *line != '\0'; line = strchr(line, '\n') + 1) {
        char name;
        int i;
        CHECK(sscanf(line, "thread %c line %d 0123456789abcdefghij\n", &name, &i) == 2);
        CHECK((name == 'a' || name == 'b') && i == next[name - 'a']++);
        CHECK(strchr(line, '\n') - line == (long)strlen("thread a line 000 0123456789abcdefghij"));
    }
    CHECK(next[0] == 200 && next[1] == 200);
    puts("ok two threads' lines whole, each in its order");

    unsetenv("AMPC_CONV_DEBUG");
    CHECK(!ampc_conv_debugging());
    setenv("AMPC_CONV_DEBUG", "", 1);  /* set, though empty: on, as getenv != NULL always was */
    CHECK(ampc_conv_debugging());
    puts("ok AMPC_CONV_DEBUG read on each call");
    return 0;
}
