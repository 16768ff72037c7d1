/*
 * autocast.h: what autocast's files share. The state of the regions lives in
 * autocast_state.c (thread-local, as torch's), the op lists in
 * autocast_lists.c, the weight-cast cache in autocast_cache.c, and the
 * engine that casts an op's arguments by its policy in autocast_dispatch.c.
 */
#ifndef AMPC_AUTOCAST_H
#define AMPC_AUTOCAST_H

#include "ampc.h"

/* Regions are kept for the two device types ampc runs on, indexed by
 * ampc_device_type (AMPC_DEVICE_CPU, AMPC_DEVICE_CUDA). */
#define AMPC_AUTOCAST_DEVICES 2

/* How an op's floating arguments are cast inside a region (torch's names). */
typedef enum {
    AMPC_POLICY_NONE = 0,            /* not autocast: runs as called */
    AMPC_POLICY_LOWER_PRECISION_FP,  /* to the region's dtype (float16 or bfloat16) */
    AMPC_POLICY_FP32,                /* to float32 */
    AMPC_POLICY_FP32_SET_OPT_DTYPE,  /* no cast; dtype=float32 passed if the first argument is eligible */
    AMPC_POLICY_FP32_APPEND_DTYPE,   /* the same for ops whose dtype-less form torch redispatches */
    AMPC_POLICY_PROMOTE,             /* all to the widest dtype among them */
    AMPC_POLICY_BANNED,              /* refused with a RuntimeError */
    AMPC_NUM_POLICIES
} ampc_policy;

extern const char *const ampc_policy_names[AMPC_NUM_POLICIES];
/* The policy named `name` ("fp32", ...; "none" too), or -1 (nothing set). */
int ampc_policy_from_name(const char *name);

/* torch's op lists (autocast_lists.c): for each device type, (name, policy)
 * rows ending with a NULL name. */
typedef struct {
    const char *name;
    ampc_policy policy;
} ampc_autocast_listing;

extern const ampc_autocast_listing *const ampc_autocast_lists[AMPC_AUTOCAST_DEVICES];
/* torch's text for binary_cross_entropy under CUDA autocast. */
extern const char ampc_banned_bce_message[];

/* One region's saved state: what __exit__ restores. */
typedef struct {
    PyObject *owner;            /* strong: the autocast object that entered (so its address cannot be reused) */
    ampc_device_type device;
    unsigned char enabled;
    unsigned char cache_enabled;
    ampc_dtype dtype;
    int suppressed;
    PyObject *overrides;        /* strong or NULL */
} ampc_autocast_frame;

/* A thread's autocast state. A new thread starts with every region off, the
 * default dtypes and the cache on. */
#define AMPC_AUTOCAST_INLINE_FRAMES 8

typedef struct {
    unsigned char enabled[AMPC_AUTOCAST_DEVICES];
    ampc_dtype dtype[AMPC_AUTOCAST_DEVICES];
    unsigned char cache_enabled;
    int nesting;                /* torch's autocast nesting counter */
    /* > 0 while an autocast op runs: the ops it calls run as called, as torch
     * masks the autocast key inside its wrappers. */
    int suppressed;
    /* The region's own policies by op name (fp32_ops=, lower_precision_ops=):
     * a dict name -> int policy, strong, or NULL. */
    PyObject *overrides[AMPC_AUTOCAST_DEVICES];
    /* The frames: in place up to AMPC_AUTOCAST_INLINE_FRAMES deep, on the heap beyond (given back
     * when the thread leaves its outermost region: a thread that ends holds nothing). */
    ampc_autocast_frame inline_frames[AMPC_AUTOCAST_INLINE_FRAMES];
    ampc_autocast_frame *frames;
    int nframes, capacity;
    /* Whether the thread's state dict holds the capsule that gives back what
     * the frames hold when the thread ends inside a region. */
    unsigned char release_at_exit;
} ampc_autocast_tls;

extern _Thread_local ampc_autocast_tls ampc_autocast;

static inline int ampc_autocast_any_enabled(void)
{
    return (ampc_autocast.enabled[AMPC_DEVICE_CPU] | ampc_autocast.enabled[AMPC_DEVICE_CUDA]) &&
           ampc_autocast.suppressed == 0;
}

/* Parse a device type as torch does ("cuda", "cpu", "cuda:1"): the device
 * type; -2 with nothing raised for a device type torch knows but ampc does
 * not run (xpu, mps, ...); -1 with an exception for a non-string (TypeError)
 * or a string that is not a device (RuntimeError "Invalid device string"). */
int ampc_autocast_device(PyObject *device_type);
/* The same, raising torch's "User specified an unsupported autocast
 * device_type" for the -2 case. */
int ampc_autocast_device_or_raise(PyObject *device_type);

/* The weight-cast cache (autocast_cache.c): process-wide, as torch's, so a
 * region entered in another thread (a backward pass) reuses the casts. */
/* The cached cast of `param` to `dtype`, a new reference, or NULL (no exception). */
PyObject *ampc_cast_cache_get(ampc_state *st, PyObject *param, ampc_dtype dtype);
/* Remember `cast` (borrowed) as param's cast to `dtype`. 0 or -1. Not kept
 * if, by then, Python (a callback) has left the thread's region the op ran
 * in (`nesting`, the thread's count when the op began): the cache would
 * outlive the region. */
int ampc_cast_cache_put(ampc_state *st, PyObject *param, ampc_dtype dtype, PyObject *cast, int nesting);
void ampc_cast_cache_clear(ampc_state *st);

/* Counters for tests and benchmarks: casts the engine made, cache hits. */
typedef struct {
    unsigned long long casts;
    unsigned long long cache_hits;
} ampc_autocast_counters;
extern ampc_autocast_counters ampc_autocast_count;

/* The types, the registry of torch's lists and the cache, at module exec. */
int ampc_autocast_state_init(PyObject *module, ampc_state *st);
int ampc_autocast_dispatch_init(PyObject *module, ampc_state *st);
extern PyMethodDef ampc_autocast_state_methods[];
extern PyMethodDef ampc_autocast_dispatch_methods[];
extern PyMethodDef ampc_autocast_cache_methods[];

#endif /* AMPC_AUTOCAST_H */
