"""Results: the record's schema (`schema`), its files (`files`) and a DataFrame of them (`frame`).

A result file is one `RunRecord` as JSON, read by one typed reader (membench.common.typedjson) and written atomically.
Everything else reads attributes, never dict keys. Import names from here: which module holds them is this
package's business.
"""

from membench.common.typedjson import build_checked
from membench.common.vocab import FINISHED, STATUSES
from membench.results.files import (
    MAX_RESULT_BYTES,
    archive,
    check_result_paths,
    is_finished,
    load_dir,
    read_result,
    result_path,
    write_record,
)
from membench.results.frame import to_frame
from membench.results.schema import (
    SCHEMA_VERSION,
    AllocationSide,
    Compiled,
    Divergence,
    Environment,
    Equivalence,
    FileRef,
    Interleaved,
    Memory,
    ModuleBytes,
    PredictionCheck,
    RankSummary,
    RunRecord,
    SavedTensor,
    SiteBytes,
    StateDiff,
    StreamUse,
    TimelineInfo,
    Timing,
)

__all__ = [
    "FINISHED", "MAX_RESULT_BYTES", "SCHEMA_VERSION", "STATUSES", "AllocationSide", "Divergence", "Environment",
    "Equivalence", "FileRef", "Interleaved", "Memory", "ModuleBytes", "PredictionCheck", "RankSummary", "RunRecord",
    "Compiled", "SavedTensor", "SiteBytes", "StateDiff", "StreamUse", "TimelineInfo", "Timing", "archive",
    "build_checked",
    "check_result_paths", "is_finished", "load_dir", "read_result", "result_path", "to_frame", "write_record",
]
