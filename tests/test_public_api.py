"""Every public name has its own docstring, and every public callable an inspect.signature (help()
and IDEs show both). The lists name whatever lacks one."""

import importlib
import inspect
import types

import pytest

import ampc

MODULES = ("ampc", "ampc.amp", "ampc.autograd", "ampc.nn", "ampc.nn.functional", "ampc.nn.utils", "ampc.optim",
           "ampc.cuda", "ampc.cpu", "ampc.models", "ampc.distributed", "ampc.random", "ampc.backends",
           "ampc.backends.cudnn", "ampc.data")


def public_names():
    """(qualified name, object) of each public callable of ampc's modules (their __all__, else what does
    not start with _), and each public method of their classes, each object once."""
    found, seen = [], set()
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType) or not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            found.append((f"{module_name}.{name}", obj))
            if isinstance(obj, type) and not issubclass(obj, BaseException):
                for attr in dir(obj):  # inherited too: ampc.GradScaler's methods are its C base's
                    member = getattr(obj, attr, None)
                    if not attr.startswith("_") and callable(member) and id(member) not in seen:
                        seen.add(id(member))
                        found.append((f"{module_name}.{name}.{attr}", member))
    return found


PUBLIC = public_names()


def own_doc(obj):
    doc = vars(obj).get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return (doc or "").strip()


def doc_of(name, obj):
    """A class or function needs its own docstring (a layer's is not Module's); a method may take the
    one of the method it overrides, as help() shows it (Linear.forward is Module.forward)."""
    if name.count(".") > name.count(".", 0, name.rfind(".")) and _is_method(name):
        return (inspect.getdoc(obj) or "").strip()
    return own_doc(obj)


def _is_method(name):
    return name.rsplit(".", 1)[0] not in MODULES


def test_the_walk_finds_the_api():
    names = {name for name, _ in PUBLIC}
    assert {"ampc.GradScaler", "ampc.GradScaler.unscale_", "ampc.nn.Linear", "ampc.nn.functional.linear",
            "ampc.optim.AdamW", "ampc.autograd.Function", "ampc.cuda.is_available"} <= names
    assert len(PUBLIC) > 300


def test_every_public_name_has_a_docstring():
    assert [name for name, obj in PUBLIC if not doc_of(name, obj)] == []


def test_every_public_callable_has_a_signature():
    """Exception types excepted: CPython gives none for them (ValueError has none either)."""
    missing = []
    for name, obj in PUBLIC:
        if isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        try:
            inspect.signature(obj)
        except (TypeError, ValueError) as error:
            missing.append(f"{name}: {error}")
    assert missing == []


def test_the_scalers_signature_is_torchs():
    """Its text signature once held 2.0**16, which inspect cannot read."""
    signature = inspect.signature(ampc.GradScaler)
    assert list(signature.parameters)[:6] == ["device", "init_scale", "growth_factor", "backoff_factor",
                                              "growth_interval", "enabled"]
    assert signature.parameters["init_scale"].default == 2.0 ** 16


@pytest.mark.parametrize("doc", ["", "   "])
def test_a_blank_docstring_counts_as_none(doc):
    def f():
        pass
    f.__doc__ = doc
    assert not own_doc(f)
