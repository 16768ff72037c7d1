/*
 * op_args.h: what the op entry points (ops.c, ops_gemm.c, ...) share (op_args.c): reading
 * their array arguments (one device for all, dtypes checked, names in the
 * messages), dense copies where a kernel needs C order, outputs on the
 * arguments' device, and the stream ordering around a GPU kernel.
 */
#ifndef AMPC_OP_ARGS_H
#define AMPC_OP_ARGS_H

#include "ampc.h"
#include "kernels/op_descriptors.h"

#define AMPC_OP_MAX_ARGS 8
#define AMPC_OP_MAX_KEEP 12

/* ampc_op_args_init sets each field but views and keep (read only below
 * nviews and nkeep; zeroing the views took 2.5 % of a small call): a new
 * field needs its line there. */
typedef struct {
    ampc_state *st;
    const char *op;                        /* the op's name, first in every message */
    ampc_view views[AMPC_OP_MAX_ARGS];
    int nviews;
    PyObject *keep[AMPC_OP_MAX_KEEP];      /* outputs and temporaries */
    int nkeep;
    ampc_device device;                    /* of the first array argument */
    const char *device_arg;
    int have_device;
    PyTypeObject *source;                  /* borrowed: results come back as this type */
} ampc_op_args;

/* AMPC_ARG_INOUT (or'ed in): the op writes the argument in place (a batch
 * norm's running statistics): it is opened for writing and must not be
 * read-only. */
enum { AMPC_ARG_ANY = 0, AMPC_ARG_FLOAT = 1, AMPC_ARG_INDEX = 2, AMPC_ARG_INOUT = 4 };

void ampc_op_args_init(ampc_op_args *a, ampc_state *st, const char *op);
void ampc_op_args_release(ampc_op_args *a);
/* Read an argument (kind: AMPC_ARG_*); NULL with TypeError/ValueError. The
 * view lives until ampc_op_args_release. */
ampc_view *ampc_op_arg(ampc_op_args *a, PyObject *obj, const char *name, int kind);
/* Keep obj (stolen) until release. */
int ampc_op_keep(ampc_op_args *a, PyObject *obj);
/* Make v C-contiguous (a copy in ampc's memory when it is not). */
int ampc_op_dense(ampc_op_args *a, ampc_view *v);
/* Make v a copy of itself laid out with these byte strides (NULL: C
 * order), in ampc's memory on v's device, kept by `a`. */
int ampc_op_relayout(ampc_op_args *a, ampc_view *v, const int64_t *strides);
/* The same converted to dtype (an integer operand of a floating op), as
 * ampc.cast converts it. */
int ampc_op_convert(ampc_op_args *a, ampc_view *v, ampc_dtype dtype, const int64_t *strides);
/* A new C-order output on the arguments' device (borrowed; kept by `a`). */
PyObject *ampc_op_output(ampc_op_args *a, ampc_dtype dtype, int ndim, const int64_t *shape, ampc_view *out);
/* The same laid out with these byte strides (NULL: C order). */
PyObject *ampc_op_output_strided(ampc_op_args *a, ampc_dtype dtype, int ndim, const int64_t *shape,
                                 const int64_t *strides, ampc_view *out);
/* A new reference to an output, as the caller's array type. */
PyObject *ampc_op_result(ampc_op_args *a, PyObject *out);
/* A tuple of n results, each as ampc_op_result gives it (None where outs[i]
 * is NULL: an output nobody asked for). */
PyObject *ampc_op_results(ampc_op_args *a, PyObject *const *outs, int n);
/* GPU: the stream to run on, after every argument's stream; and after the
 * kernel, every argument's stream after it. Nothing on the CPU. */
int ampc_op_stream_begin(ampc_op_args *a, void **stream);
int ampc_op_stream_end(ampc_op_args *a, void *stream);
/* The hint a dtype mismatch gets when one side is float64 and the other
 * not: NumPy's default meeting a float32 model. "" otherwise. */
const char *ampc_op_float64_hint(ampc_dtype a, ampc_dtype b);
int ampc_op_normalize_dim(const char *op, int64_t dim, int ndim, int64_t *out);
/* The (outer, n, inner) layout of a dense array around dimension dim. */
ampc_rows ampc_op_rows(const ampc_view *v, int64_t dim);
/* dtype= of op a->op (None: *have = 0): a floating dtype, or TypeError. */
int ampc_op_parse_dtype(const ampc_op_args *a, PyObject *obj, int *have, ampc_dtype *dtype);
int ampc_op_check_same_shape(const char *op, const ampc_view *x, const char *xn, const ampc_view *y,
                             const char *yn);
/* v's element strides when broadcast to (ndim, shape): 0 where broadcast;
 * ValueError naming `name` when the shapes do not broadcast. */
int ampc_op_broadcast_strides(const char *op, const char *name, const ampc_view *v, int ndim,
                              const int64_t *shape, int64_t *strides);
/* torch's type promotion (type_promotion.c). */
ampc_dtype ampc_promote_float(ampc_dtype x, ampc_dtype y);  /* two floating dtypes */
typedef enum {
    AMPC_CATEGORY_NONE = -1,
    AMPC_CATEGORY_BOOL,
    AMPC_CATEGORY_INTEGER,
    AMPC_CATEGORY_FLOAT,
} ampc_type_category;
typedef struct {
    ampc_type_category category;  /* the highest of the group's operands */
    ampc_dtype floating;          /* their floating dtypes promoted, if any */
} ampc_type_group;
typedef struct {
    ampc_type_group dims, zero_dim, numbers;
} ampc_promotion;
void ampc_promotion_init(ampc_promotion *r);
void ampc_promotion_add_array(ampc_promotion *r, const ampc_view *v);
void ampc_promotion_add_number(ampc_promotion *r, ampc_type_category category);
/* The result's category, and its dtype where that is floating. */
ampc_type_group ampc_promotion_result(const ampc_promotion *r);

/* CPU (ops_gemm.c): an ndarray of v's values in dtype acc, over v's memory
 * when v has that dtype, else a converted copy (new reference); and NumPy's
 * matmul of two ndarrays (its BLAS, GIL released), always an ndarray: a
 * new one, or out (a new reference) written in place where out is given. */
PyObject *ampc_op_acc_ndarray(ampc_op_args *a, const ampc_view *v, ampc_dtype acc);
PyObject *ampc_np_matmul(ampc_state *st, PyObject *x, PyObject *y, PyObject *out);

/* Run the backend table's `member` on the arguments' device: on a device
 * backend, on ampc's stream, ordered after the arguments' streams and they
 * after it; with the GIL released where the backend allows it (the CPU's).
 * 0, or -1 with an exception. */
#define AMPC_RUN_KERNEL(a, member, desc)                                                        \
    ({                                                                                          \
        const ampc_backend *b_ = ampc_backend_of((a)->st, (a)->device);                         \
        void *stream_;                                                                          \
        int rc_ = ampc_op_stream_begin((a), &stream_);                                          \
        if (rc_ == 0) {                                                                         \
            int status_;                                                                        \
            if (b_->runs_without_gil) {                                                         \
                Py_BEGIN_ALLOW_THREADS                                                          \
                status_ = b_->member((a)->device.index, stream_, (desc));                       \
                Py_END_ALLOW_THREADS                                                            \
            }                                                                                   \
            else {                                                                              \
                status_ = b_->member((a)->device.index, stream_, (desc));                       \
            }                                                                                   \
            rc_ = status_ == AMPC_OK ? ampc_op_stream_end((a), stream_)                         \
                                     : ampc_backend_raise((a)->st, (a)->device, status_, (a)->op); \
        }                                                                                       \
        rc_;                                                                                    \
    })

extern PyMethodDef ampc_ops_methods[];
extern PyMethodDef ampc_gemm_methods[];
extern PyMethodDef ampc_spatial_methods[];
extern PyMethodDef ampc_embedding_methods[];
extern PyMethodDef ampc_attention_methods[];


#endif /* AMPC_OP_ARGS_H */
