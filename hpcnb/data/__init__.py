"""Data sets and real data for the notebooks.

Embedded defaults need no network (:func:`digits`, :func:`text_corpus`). Real traces
(SWF logs, measured deep-learning step times, ElastiSim inputs) are described in the
checksummed registry and found through :func:`path` / :func:`data_path` (``HPCNB_DATA``
folder, then the cache) or downloaded with :func:`fetch` (``hpcnb data fetch``); see
:mod:`hpcnb.data.registry`.
"""

from hpcnb.data.embedded import DigitsSplit, digits, text_corpus
from hpcnb.data.registry import (
    ENV_VAR,
    MIRROR_VAR,
    ChecksumError,
    DataFile,
    DataNotFoundError,
    DownloadError,
    available,
    cache_folder,
    data_dir,
    data_path,
    fetch,
    fetch_all,
    files_read,
    path,
    registry,
    stand_in_notice,
    verify,
)

__all__ = [
    "ENV_VAR",
    "MIRROR_VAR",
    "ChecksumError",
    "DataFile",
    "DataNotFoundError",
    "DigitsSplit",
    "DownloadError",
    "available",
    "cache_folder",
    "data_dir",
    "data_path",
    "digits",
    "fetch",
    "fetch_all",
    "files_read",
    "path",
    "registry",
    "stand_in_notice",
    "text_corpus",
    "verify",
]
