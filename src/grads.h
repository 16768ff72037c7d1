/* grads.h: an optimizer's gradients, checked and grouped by device (grads.c). */
#ifndef AMPC_GRADS_H
#define AMPC_GRADS_H

#include "ampc.h"
#include "unscale.h"

/* CPU and one GPU, as a training step can mix them. */
#define AMPC_GRADS_MAX_DEVICES 2

typedef struct {
    ampc_view view;
    ampc_loop loop;     /* over its elements; one contiguous run when dense */
    int dense;
    int group, index;   /* where it sits in optimizer.param_groups */
    int device_slot;    /* index into ampc_grads.devices */
    PyObject *param;    /* strong */
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
 * with an exception and nothing held. */
int ampc_grads_collect(ampc_state *st, PyObject *optimizer, int allow_fp16, int for_writing, ampc_grads *g);
void ampc_grads_release(ampc_grads *g);

#endif /* AMPC_GRADS_H */
