"""Running jobs in their own processes, so that one run's OOM, crash or hang never costs the others' results.
The parent's side only: what runs inside the processes is membench.child.

- `sweep`: every job of a sweep in turn, in one locked results folder (`run_all`), Ctrl-C and --resume.
- `lifecycle`: one run whatever its process (`run_job`): log, stages, timeout, kill, failure record;
  the `Launcher` interface says how a worker starts: `process` (a new Python process, or torchrun),
  `fork` (a forked child for a workload object, or the caller's own process).
- `distributed`: torchrun's process group and the merge of the ranks' records; `progress` carries a worker's
  stages back; `lifeline` makes a child die with the sweep.
- `probe`: a user's code planned or predicted in a child process (plan.plan, predict, fit).

Nothing is imported here.
"""
