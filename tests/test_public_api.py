import subprocess
import sys

import monarch_nb


def test_all_is_sorted_and_complete():
    hidden = _MODULES | _EXTENSION_HOOKS
    public = sorted(n for n in dir(monarch_nb) if not n.startswith("_") and n not in hidden)
    assert monarch_nb.__all__ == sorted(monarch_nb.__all__)
    assert sorted(monarch_nb.__all__) == public


_MODULES = {"magics", "native", "worker", "Any"}
_EXTENSION_HOOKS = {"load_ipython_extension", "unload_ipython_extension"}


def test_public_names_read_as_monarch_nb():
    assert monarch_nb.ProcMesh.__module__ == "monarch_nb"
    assert monarch_nb.MeshFailure.__module__ == "monarch_nb"


def test_import_is_light():
    # Mesh start must not pay for torch, IPython or ipywidgets.
    heavy = ("torch", "IPython", "ipywidgets", "numpy", "cloudpickle")
    code = f"import sys, monarch_nb; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
