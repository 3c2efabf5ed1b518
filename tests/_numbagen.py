"""A tiny generated module with one Numba ``cache=True`` function, for the cache tests."""

from __future__ import annotations

import textwrap

#: Module text: ``twice(x) = 2 * x`` compiled with Numba's on-disk cache.
NUMBA_SOURCE = textwrap.dedent(
    """
    import numba


    @numba.njit(cache=True)
    def twice(x):
        return 2 * x
    """
)


def numba_script(stem: str) -> str:
    """A script run as ``python -c SCRIPT FOLDER SOURCE``: load, check and count cache hits."""
    return textwrap.dedent(
        f"""
        import sys
        import warnings
        warnings.simplefilter("always")
        from hpcnb.codecache import load_generated
        mod = load_generated(sys.argv[2], sys.argv[1], {stem!r})
        assert mod.twice(21) == 42
        print("hits", sum(mod.twice.stats.cache_hits.values()))
        """
    )
