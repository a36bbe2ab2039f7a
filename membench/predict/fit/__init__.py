"""The largest batch that fits a memory budget, per technique: found from predictions, confirmed on a GPU.

From a few traces (search.fit_batch): a training step makes the same allocations in the same order at every batch
size, with sizes affine in the batch, for most models. That is checked, not assumed: two predictions (at two and three
batch steps; one is often special, as a transpose of one sample is already contiguous and copies nothing; where two
and three differ, three and four are tried) must make the same allocations and frees in the same order, every size
is derived as a + c x batch (affine.AffineTrace), and the search then runs on the derived allocations alone (peak
allocated is a sum; reserved memory comes from the caching allocator simulator, a fraction of a second per batch).
CUDA kernel scratch (a reduction's staging buffers, taken only past some size) is not affine: it is worked out again
at each batch from its calls' tensor layouts, which are. The answer and the first batch over are then predicted for
real and must match the derived allocations event for event; where anything differs (data-dependent shapes, a
kernel choice that changes with the size) the full search runs instead, and says so.

The full search (search.largest_batch) predicts every batch it tries: exponential (1, 2, 4, ... until one does not
fit) then binary. Where a CUDA GPU is present, the predicted batch is then run for real in a subprocess under the
budget (confirm.confirm_on_gpu); an OOM there is a data point (the prediction was optimistic: step down), a success
is tried one step further up.

`fit --by seq-len` (search.longest_sequence) searches the sequence length at a fixed batch instead, predicting every
length it tries (attention's scores grow with the square of the length: not affine).

Techniques are fitted side by side in processes forked from the one that loaded the workload (launch.pool, from
child/probe.py); --jobs' default is the cores this process may run on.
"""

from membench.launch.pool import default_workers as default_jobs
from membench.predict.fit.affine import AffineTrace, NotAffine
from membench.predict.fit.confirm import confirm_on_gpu
from membench.predict.fit.search import Fit, batch_step, bisect_last, fit_batch, largest_batch, longest_sequence

__all__ = ["AffineTrace", "Fit", "NotAffine", "batch_step", "bisect_last", "confirm_on_gpu", "default_jobs",
           "fit_batch", "largest_batch", "longest_sequence"]
