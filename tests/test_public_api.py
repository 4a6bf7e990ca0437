import subprocess
import sys

import monarch_nb

# Module-level names of the package that are not API: submodules, typing helpers.
_NOT_API = {"annotations", "importlib", "magics", "native", "worker", "Any", "TYPE_CHECKING"}
_NOT_API |= {"debug", "tensor", "widgets", "config", "spmd", "job"}  # imported submodules
_NOT_API |= {"actor", "rdma"}  # Monarch's import paths, modules of their own
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
    from monarch_nb._model._errors import RemoteError  # renamed before first public use

    assert RemoteError.__module__ == "monarch_nb"


def test_import_is_light():
    # Mesh start must not pay for torch, IPython or ipywidgets.
    heavy = ("torch", "IPython", "ipywidgets", "numpy", "cloudpickle", "asyncio")
    code = f"import sys, monarch_nb; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = (
        "import sys, monarch_nb._worker._main; "
        "print('zmq' in sys.modules, 'asyncio' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True False"  # a worker loads the wire, not asyncio


def test_each_runtime_module_imports_alone_and_the_sides_stay_apart():
    # Each module in a fresh interpreter: an import cycle between runtime
    # modules fails here. Worker-side code never loads controller-side code.
    import pathlib

    package = pathlib.Path(monarch_nb.__file__).parent
    modules = [
        f"monarch_nb.{side}.{path.stem}"
        for side in ("_model", "_wire", "_runtime", "_services", "_controller", "_worker", "_agent")
        for path in sorted((package / side).glob("_*.py"))
        if path.stem != "__init__"
    ]
    assert len(modules) > 20
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    before = set(sys.modules)\n"
        "    importlib.import_module(name)\n"
        "    loaded = set(sys.modules) - before\n"
        "    if '._worker.' in name or '._agent.' in name:\n"
        "        bad = [m for m in loaded if m.startswith('monarch_nb._controller')]\n"
        "        assert not bad, (name, bad)\n"
        "    for m in [m for m in sys.modules if m.startswith('monarch_nb.')]:\n"
        "        del sys.modules[m]\n"
    )
    for name in modules:
        out = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True)
        assert out.returncode == 0, f"{name}: {out.stderr[-2000:]}"


def test_the_tensor_engine_sits_above_the_core():
    # A worker unpickles the tensor engine's rank-side actor: that loads neither
    # controller code nor torch (its __init__ does). Importing the package is
    # cheap; each module imports alone; the core never imports the engine.
    import pathlib

    package = pathlib.Path(monarch_nb.__file__).parent
    code = (
        "import sys, monarch_nb.tensor._worker, monarch_nb.tensor\n"
        "print(sorted(m for m in sys.modules if m.startswith('monarch_nb._controller')"
        " or m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    modules = [f"monarch_nb.tensor.{p.stem}" for p in sorted((package / "tensor").glob("_*.py"))]
    code = (
        "import importlib, sys, torch\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "    for m in [m for m in sys.modules if m.startswith('monarch_nb.')]:\n"
        "        del sys.modules[m]\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    core = [
        package / side
        for side in ("_model", "_wire", "_runtime", "_services", "_controller", "_worker")
    ]
    for path in [f for side in core for f in side.glob("*.py")]:
        text = path.read_text()
        assert "from ..tensor" not in text, path
        assert "monarch_nb.tensor" not in text, path  # _tensor_link's loader, installed above
