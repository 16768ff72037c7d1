/*
 * dlpack.h: the DLPack ABI, declared from the published specification
 * (https://dmlc.github.io/dlpack/latest/, major version 1).
 *
 * The numbers below are the ABI: device types, type codes, struct layouts and
 * capsule names are fixed by the specification, so this header only declares
 * what ampc reads and writes. Nothing here is copied from another project.
 *
 * Two managed-tensor layouts exist and they are NOT layout compatible:
 *   - legacy      DLManagedTensor:          { DLTensor; manager_ctx; deleter }
 *   - versioned   DLManagedTensorVersioned: { version; manager_ctx; deleter; flags; DLTensor }
 * In the versioned struct everything up to `flags` is frozen across major
 * versions, so on a major mismatch a consumer may still call the deleter.
 */
#ifndef AMPC_DLPACK_H
#define AMPC_DLPACK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLPACK_MAJOR_VERSION 1
/* Minor 1 added the float8/6/4 type codes; ampc understands every field of 1.x. */
#define DLPACK_MINOR_VERSION 1

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,     /* pinned host memory: readable from the CPU */
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13, /* unified memory */
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
    kDLTrn = 18,
} DLDeviceType;

typedef struct {
    int32_t device_type;  /* a DLDeviceType */
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
    /* 7..17: float8, float6 and float4 variants (DLPack 1.1). The two below are the
     * ones ampc's float8 dtypes will use (issue 53); the others stay refused. */
    kDLFloat8_e4m3fn = 10,
    kDLFloat8_e5m2 = 12,
} DLDataTypeCode;

typedef struct {
    uint8_t code;    /* a DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes;  /* 1 for ordinary arrays */
} DLDataType;

typedef struct {
    void *data;          /* may be NULL for a zero-size tensor */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;    /* in elements, not bytes; NULL means C-contiguous */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1ULL << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1ULL << 1)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1ULL << 2)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* Capsule names. A consumer renames the capsule to the "used_" form when it
 * takes ownership; the capsule's destructor calls the deleter only while the
 * capsule still carries the unused name. */
#define DLPACK_CAPSULE_NAME "dltensor"
#define DLPACK_CAPSULE_USED_NAME "used_dltensor"
#define DLPACK_VERSIONED_CAPSULE_NAME "dltensor_versioned"
#define DLPACK_VERSIONED_CAPSULE_USED_NAME "used_dltensor_versioned"

/* DLPack 1.3's C exchange API: a PyCapsule named "dlpack_exchange_api" in
 * the attribute `__dlpack_c_exchange_api__` of a producer's *type*, holding a
 * table of C functions that export a tensor without any Python call. ampc
 * uses the non-owning export (valid until control returns to Python, while
 * ampc holds the tensor) and the producer's current work stream, which its
 * kernels then order themselves after. Functions return 0, or -1 with a
 * Python exception set; every field but dltensor_from_py_object_no_sync is
 * required to be non-NULL. */
#define DLPACK_EXCHANGE_API_ATTR "__dlpack_c_exchange_api__"
#define DLPACK_EXCHANGE_API_CAPSULE "dlpack_exchange_api"

typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;
    struct DLPackExchangeAPIHeader *prev_api;  /* an older table, or NULL */
} DLPackExchangeAPIHeader;

typedef struct {
    DLPackExchangeAPIHeader header;
    int (*managed_tensor_allocator)(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                                    void (*set_error)(void *error_ctx, const char *kind, const char *message));
    int (*managed_tensor_from_py_object_no_sync)(void *py_object, DLManagedTensorVersioned **out);
    int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned *tensor, void **out_py_object);
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_current_stream);
} DLPackExchangeAPI;

/* Stream sentinels a CUDA consumer may pass to __dlpack__(stream=...). */
#define DLPACK_STREAM_LEGACY_DEFAULT 1
#define DLPACK_STREAM_PER_THREAD_DEFAULT 2
#define DLPACK_STREAM_NO_SYNC (-1)

#ifdef __cplusplus
}
#endif

#endif /* AMPC_DLPACK_H */
