"""The compiled kernels (huggy_agent/_native.c); everything else is in pyproject.toml.

Optional: where no C compiler is found the package installs without them and runs the same
computations in numpy, onnxruntime and torch (`huggy_agent.native.AVAILABLE` says which).
-ffp-contract=off keeps the noise bit-identical to numpy's (no fused multiply-add).
"""

import sys

from setuptools import Extension, setup

COMPILE_ARGS = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off", "-fno-math-errno",
                                                   "-fno-trapping-math"]

setup(ext_modules=[Extension("huggy_agent._native", ["huggy_agent/_native.c"],
                             depends=["huggy_agent/json_act_body.h"],
                             extra_compile_args=COMPILE_ARGS, optional=True)])
