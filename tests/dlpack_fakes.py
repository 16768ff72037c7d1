"""DLPack capsules built by hand with ctypes, to feed ampc malformed, foreign or
counted tensors, and to read what ampc exports."""

import ctypes

DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


READ_ONLY, IS_COPIED = 1, 2
NAMES = {False: b"dltensor", True: b"dltensor_versioned"}

_new = ctypes.pythonapi.PyCapsule_New
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_name(capsule):
    return _get_name(capsule).decode()


class FakeTensor:
    """A hand-made managed tensor in a capsule (with no destructor, so only a
    consumer ever calls the deleter); `deleted` counts deleter calls."""

    def __init__(self, data=None, shape=(4,), strides=None, code=2, bits=32, lanes=1,
                 device=(1, 0), versioned=True, major=1, flags=0, byte_offset=0, ndim=None,
                 null_shape=False):
        self.deleted = 0
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = (ctypes.c_int64 * max(len(shape), 1))(*(strides or ()))
        self._deleter = DELETER(self._count)
        t = DLTensor()
        t.data = data
        t.device = DLDevice(*device)
        t.ndim = len(shape) if ndim is None else ndim
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = ctypes.cast(None, ctypes.POINTER(ctypes.c_int64)) if null_shape else self._shape
        t.strides = self._strides if strides is not None else ctypes.cast(None, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = byte_offset
        if versioned:
            self.managed = DLManagedTensorVersioned(DLPackVersion(major, 1), None, self._deleter, flags, t)
        else:
            self.managed = DLManagedTensor(t, None, self._deleter)
        self.capsule = _new(ctypes.addressof(self.managed), NAMES[versioned], None)

    def _count(self, _):
        self.deleted += 1


CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DestroyedCapsule:
    """Capsules over `fake`'s tensor (a FakeTensor) whose destructor, as a producer's written with
    ctypes, Cython or pybind11 would, runs Python when the capsule dies; `destroyed` counts it. The
    capsule is not kept here: its consumer's reference is the last."""

    def __init__(self, fake):
        self.destroyed = 0
        self.fake = fake
        self._destructor = CAPSULE_DESTRUCTOR(self._count)

    def capsule(self):
        versioned = isinstance(self.fake.managed, DLManagedTensorVersioned)
        return _new(ctypes.addressof(self.fake.managed), NAMES[versioned],
                    ctypes.cast(self._destructor, ctypes.c_void_p))

    def _count(self, _):
        self.destroyed += 1


def exported(capsule):
    """The managed tensor inside one of ampc's capsules (versioned or legacy)."""
    versioned = capsule_name(capsule) == "dltensor_versioned"
    ptr = _get_pointer(capsule, NAMES[versioned])
    kind = DLManagedTensorVersioned if versioned else DLManagedTensor
    return ctypes.cast(ptr, ctypes.POINTER(kind)).contents


class Producer:
    """Wraps an array and records how ampc calls its DLPack methods."""

    def __init__(self, array, device=None, legacy_only=False):
        self.array = array
        self.device = device
        self.legacy_only = legacy_only
        self.calls = []

    def __dlpack_device__(self):
        return self.device or self.array.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        if self.legacy_only and set(kwargs) - {"stream"}:
            raise TypeError("__dlpack__() got an unexpected keyword argument")
        return self.array.__dlpack__(**kwargs)
