"""Build the optional C fast path of the sketch (naig/sketch/_kernel.c); metadata in pyproject.toml.

The extension is optional: without a C compiler the install still succeeds and
naig falls back to its numpy path (same results, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # -ffp-contract=off: no fused multiply-add, so the float64 sums are the same on every CPU
        Extension(
            "naig.sketch._kernel",
            ["naig/sketch/_kernel.c"],
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        )
    ]
)
