"""Persistence with commit semantics, shared by every saved object of funnel-rag.

Split by role:

* :mod:`~funnel_core.persist.commit`: the commit protocol (ownership marker, immutable
  snapshots, the atomically replaced ``CURRENT`` pointer, journal, readers' lock, recovery);
  :func:`save_snapshot`, :func:`load_snapshot`, :func:`snapshot_info`, :func:`snapshot_owner`;
* :mod:`~funnel_core.persist.tagged_json`: JSON that keeps tuples and non-string keys
  (:func:`json_safe`, :func:`from_json_safe`);
* :mod:`~funnel_core.persist.units_io`: units on disk (:func:`write_units`, :func:`read_units`)
  and the copies an index keeps (:func:`prepare_units`);
* :mod:`~funnel_core.persist.validate`: checks of settings read from a manifest
  (:func:`check_number`, :func:`check_model_name`).

The public names are re-exported here (``from funnel_core.persist import save_snapshot``). The
test hooks (``_step_hook``) and private helpers live in :mod:`~funnel_core.persist.commit`:
patch them there.
"""

from funnel_core.persist.commit import LAYOUT_VERSION, load_snapshot, save_snapshot, snapshot_info, snapshot_owner
from funnel_core.persist.tagged_json import from_json_safe, json_safe
from funnel_core.persist.units_io import prepare_units, read_units, write_json, write_units
from funnel_core.persist.validate import check_model_name, check_number

__all__ = [
    "LAYOUT_VERSION",
    "save_snapshot",
    "load_snapshot",
    "snapshot_info",
    "snapshot_owner",
    "write_units",
    "read_units",
    "write_json",
    "prepare_units",
    "json_safe",
    "from_json_safe",
    "check_number",
    "check_model_name",
]
