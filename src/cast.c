/*
 * cast.c: one view converted into another (ampc_cast_views), between float32,
 * float16, bfloat16 and float64, integer and bool sources as torch's .to()
 * converts them, through the device's backend (cpu/cast_cpu.c, cuda/cast.cu),
 * ordered on the arrays' streams on a GPU. The caller has checked both views
 * and allocated the output (copy.c, an Array's copy, the op entry points).
 */
#include "ampc.h"


/* Below this many elements the GIL stays held: releasing it costs more than
 * the cast. */
#define GIL_RELEASE_ELEMENTS (1 << 14)

int ampc_cast_views(ampc_state *st, ampc_view *dst, const ampc_view *src, int fresh_output)
{
    if (dst->numel == 0)
        return 0;
    char *data[2] = {dst->data, src->data};
    const int64_t *strides[2] = {dst->strides, src->strides};
    ampc_loop loop;
    ampc_loop_init(&loop, 2, dst->ndim, dst->shape, data, strides);
    const ampc_backend *b = ampc_backend_of(st, dst->device);
    const int device = dst->device.index;

    if (dst->device.type == AMPC_DEVICE_CPU) {  /* no streams */
        int status;
        if (b->runs_without_gil && loop.numel >= GIL_RELEASE_ELEMENTS) {
            Py_BEGIN_ALLOW_THREADS
            status = b->cast(device, NULL, &loop, dst->dtype, src->dtype, fresh_output);
            Py_END_ALLOW_THREADS
        }
        else {
            status = b->cast(device, NULL, &loop, dst->dtype, src->dtype, fresh_output);
        }
        return status == AMPC_OK ? 0 : ampc_backend_raise(st, dst->device, status, "cast");
    }
    void *stream = ampc_current_stream(device, NULL);
    /* The input's producer ordered its work before `src->stream`; wait for
     * that stream if the cast runs on another one. */
    int status = AMPC_OK;
    if (src->stream != stream)
        status = b->stream_wait(device, stream, src->stream);
    if (status == AMPC_OK && dst->stream != stream)
        status = b->stream_wait(device, stream, dst->stream);
    if (status == AMPC_OK)
        status = b->cast(device, stream, &loop, dst->dtype, src->dtype, fresh_output);
    /* Each array's contents are ready on its own stream, and its memory is
     * returned on that stream: order both after the cast. */
    if (status == AMPC_OK && dst->stream != stream)
        status = b->stream_wait(device, dst->stream, stream);
    if (status == AMPC_OK && src->stream != stream && src->stream != dst->stream)
        status = b->stream_wait(device, src->stream, stream);
    return status == AMPC_OK ? 0 : ampc_backend_raise(st, dst->device, status, "cast");
}
