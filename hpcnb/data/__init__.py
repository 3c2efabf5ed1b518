"""Data sets and real data for the notebooks.

Embedded defaults need no network (:func:`digits`, :func:`text_corpus`). Real traces
(SWF logs, measured deep-learning step times, ElastiSim inputs) are described in the
checksummed registry and found through :func:`path` / :func:`data_path` (``HPCNB_DATA``
folder, then the cache) or downloaded with :func:`fetch` (``hpcnb data fetch``); the
folders, environment variables and the log of files read are in :mod:`hpcnb.data.registry`.
"""

from hpcnb.data.embedded import DigitsSplit, digits, digits_folds, kfold_splits, text_corpus
from hpcnb.data.registry import (
    ChecksumError,
    DataFile,
    DataNotFoundError,
    DownloadError,
    available,
    data_path,
    fetch,
    fetch_all,
    path,
    registry,
    stand_in_notice,
    verify,
)

__all__ = [
    # embedded data sets (no network)
    "DigitsSplit",
    "digits",
    "digits_folds",
    "kfold_splits",
    "text_corpus",
    # the registry of real data: find, fetch, check
    "DataFile",
    "available",
    "data_path",
    "fetch",
    "fetch_all",
    "path",
    "registry",
    "stand_in_notice",
    "verify",
    # errors
    "ChecksumError",
    "DataNotFoundError",
    "DownloadError",
]
