"""What people read about a run (SPEC 8): ``summary.md``, ``compass show``
and the report ``compass launch`` prints when a run ends.

Private package: it only reads what the store (:mod:`agentcompass._store`)
wrote or computed, and writes nothing.
"""

from ._end import display_path as display_path
from ._end import render_request_report as render_request_report
from ._show import render_run_list as render_run_list
from ._show import render_run_table as render_run_table
from ._summary import render_summary as render_summary
