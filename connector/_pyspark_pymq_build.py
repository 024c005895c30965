"""setuptools' ``build_py``, plus the ``.pth`` file that lets Spark's Python processes find pip's pyspark.

Named in ``setup.cfg`` (``cmdclass``) and shipped as a module so that a build from the sdist finds
it too; nothing imports it at run time. A ``.pth`` file works only at the top of site-packages,
where no package directory reaches, so the build writes it there. What it does:
:mod:`_pyspark_pymq_path`.
"""

from __future__ import annotations

import os

from setuptools.command.build_py import build_py as _build_py  # type: ignore[import-untyped]

PTH = "pyspark_pymq-pyspark-path.pth"
# Runs at every interpreter start of the environment: a string test, and an import only in
# processes that have a pyspark.zip on sys.path (Spark's).
PTH_LINE = (
    'import sys; any(str(p).endswith("pyspark.zip") for p in sys.path) '
    'and __import__("_pyspark_pymq_path").prefer_installed_pyspark()\n'
)


class build_py(_build_py):  # type: ignore[misc]  # setuptools' command name, untyped base
    def run(self) -> None:
        super().run()
        self.mkpath(self.build_lib)
        with open(self._pth_output(), "w", encoding="utf-8") as f:
            f.write(PTH_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), self._pth_output()]

    def _pth_output(self) -> str:
        return os.path.join(self.build_lib, PTH)
