"""Build hook for the optional C extension; all metadata lives in pyproject.toml.

The extension is optional: if it cannot be compiled (no C compiler, not Linux),
installation still succeeds and ``monarch_nb.native.RDMABuffer`` raises an
error that says why the native data plane is unavailable.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build extensions, but report a failure instead of aborting the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self._warn(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        print(
            f"warning: building monarch_nb.native._memory failed ({exc}); "
            "monarch_nb installs without its native data plane",
            file=sys.stderr,
        )


setup(
    ext_modules=[
        Extension(
            "monarch_nb.native._memory",
            sources=["monarch_nb/native/_memory.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
