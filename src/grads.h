/* grads.h: an optimizer's gradients, checked and grouped by device (grads.c). */
#ifndef AMPC_GRADS_H
#define AMPC_GRADS_H

#include "ampc.h"
#include "kernels/grad_list.h"

/* CPU and one GPU, as a training step can mix them. */
#define AMPC_GRADS_MAX_DEVICES 2

typedef struct {
    ampc_view view;
    ampc_loop *loop;    /* how to walk it when not dense (PyMem, owned); NULL when dense */
    char *dense_data;   /* dense: the lowest address of its elements */
    int group, index;   /* where it sits in optimizer.param_groups */
    int device_slot;    /* index into ampc_grads.devices */
    PyObject *param;    /* strong */
    PyObject *written;  /* strong: the gradient where it is a Parameter to be written, else NULL */
} ampc_grad_entry;

typedef struct {
    ampc_grad_entry *entries;
    int64_t n, capacity;
    ampc_grad_ref *refs;                       /* all gradients, grouped by device */
    int ndevices;
    ampc_device devices[AMPC_GRADS_MAX_DEVICES];
    int64_t first[AMPC_GRADS_MAX_DEVICES];     /* refs of device d: refs[first[d] .. first[d] + count[d]) */
    int64_t count[AMPC_GRADS_MAX_DEVICES];
} ampc_grads;

/* Every `.grad` that is not None, checked (for writing: writable, no shared
 * elements; float16 refused unless allow_fp16, with torch's text). 0, or -1
 * with an exception and no gradient held. `g` may come from an earlier
 * ampc_grads_clear: its memory is reused (this runs every step). */
int ampc_grads_collect(ampc_state *st, PyObject *optimizer, int allow_fp16, int for_writing, ampc_grads *g);
/* Drop the gradients, keep the memory for the next collect. */
void ampc_grads_clear(ampc_grads *g);

/* Count the write in the version of each gradient that is a Parameter, after
 * the gradients collected for writing were written. */
void ampc_grads_count_writes(ampc_state *st, const ampc_grads *g);
/* Drop everything. */
void ampc_grads_release(ampc_grads *g);

#endif /* AMPC_GRADS_H */
