import subprocess
import sys

import monarch_nb

# Module-level names of the package that are not API: submodules, typing helpers.
_NOT_API = {"annotations", "importlib", "magics", "native", "worker", "Any", "TYPE_CHECKING"}
_EXTENSION_HOOKS = {"load_ipython_extension", "unload_ipython_extension"}


def test_all_is_sorted_complete_and_resolves():
    assert monarch_nb.__all__ == sorted(monarch_nb.__all__)
    for name in monarch_nb.__all__:
        assert getattr(monarch_nb, name) is not None
    public = {n for n in dir(monarch_nb) if not n.startswith("_")}
    assert public - _NOT_API - _EXTENSION_HOOKS == set(monarch_nb.__all__)


def test_public_names_read_as_monarch_nb():
    assert monarch_nb.ProcMesh.__module__ == "monarch_nb"
    assert monarch_nb.MeshFailure.__module__ == "monarch_nb"
    from monarch_nb._errors import RemoteError  # renamed even before first public use

    assert RemoteError.__module__ == "monarch_nb"


def test_import_is_light():
    # Mesh start must not pay for torch, IPython or ipywidgets.
    heavy = ("torch", "IPython", "ipywidgets", "numpy", "cloudpickle", "asyncio")
    code = f"import sys, monarch_nb; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = "import sys, monarch_nb._worker; print('zmq' in sys.modules, 'asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True False"  # a worker loads the wire, not asyncio
