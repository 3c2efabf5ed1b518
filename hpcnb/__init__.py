"""hpcnb: hands-on notebooks for HPC and ML-systems research techniques.

The package holds every reusable piece of code behind the notebooks in ``notebooks/``.
Technique sub-packages are imported on demand (``import hpcnb.winograd``); the top level
exposes the record and claims contract shared by all notebooks and the error base.
"""

from hpcnb.claims import claim, claims_table, reproducibility_summary
from hpcnb.errors import HpcnbError
from hpcnb.records import (
    Record,
    read_record_details,
    read_records,
    record,
    record_accuracy,
)
from hpcnb.stats import Estimate

__all__ = [
    "Estimate",
    "HpcnbError",
    "Record",
    "claim",
    "claims_table",
    "read_record_details",
    "read_records",
    "record",
    "record_accuracy",
    "reproducibility_summary",
]
__version__ = "0.1.0"
