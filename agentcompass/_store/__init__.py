"""The results store (SPEC 8, 12): the run directory's layout (``_layout``,
the one place its names are spelled), durable writes, task keys, the one
reader of run directories (``_load``), results formats (``_formats``) and
metrics.

Private package: the runtime imports these names; users see only the files.
"""

from ._disk import Disk as Disk
from ._keys import task_key as task_key
from ._load import LoadedRun as LoadedRun
from ._load import latest_run as latest_run
from ._load import load_run as load_run
from ._metrics import compute_metrics as compute_metrics
from ._metrics import reduce_task as reduce_task
from ._run_store import RunStore as RunStore
from ._run_store import StoreClosedError as StoreClosedError
from ._run_store import new_run_id as new_run_id
from ._run_store import open_run_store as open_run_store
