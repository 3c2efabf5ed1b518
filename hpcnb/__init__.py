"""hpcnb: hands-on notebooks for HPC and ML-systems research techniques.

The package holds every reusable piece of code behind the notebooks in ``notebooks/``.
Technique sub-packages are imported on demand (``import hpcnb.winograd``); the top level
exposes only the record contract shared by all notebooks.
"""

from hpcnb.records import Record, read_record_details, read_records, record

__all__ = ["Record", "read_record_details", "read_records", "record"]
__version__ = "0.1.0"
