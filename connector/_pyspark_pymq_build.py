"""setuptools' ``build_py``, plus the ``.pth`` file that lets Spark's Python processes find pip's pyspark.

Used only at build time (``setup.cfg`` ``cmdclass``); not installed. A ``.pth`` file works only at
the top of site-packages, where no package directory reaches, hence this step. What the file does:
:mod:`_pyspark_pymq_path`.
"""

from __future__ import annotations

import os

from setuptools.command.build_py import build_py as _build_py  # type: ignore[import-untyped]

PTH = "pyspark_pymq-pyspark-path.pth"


class build_py(_build_py):  # type: ignore[misc]  # setuptools' command name, untyped base
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH), self._pth_output())

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), self._pth_output()]

    def _pth_output(self) -> str:
        return os.path.join(self.build_lib, PTH)
