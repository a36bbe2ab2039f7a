"""Running jobs in their own processes, so that one run's OOM, crash or hang never costs the others' results.

- `sweep`: every job of a sweep in turn, in one locked results folder (`run_all`), Ctrl-C and --resume.
- `lifecycle`: one run whatever its process (`run_job`): archive, log, stages, timeout, kill, failure record;
  the `Launcher` interface says how a worker starts: `process` (a new Python process, or torchrun),
  `fork` (a forked child for a workload object, or the caller's own process).
- `worker`: the child side, one Job -> one result file; `distributed` joins torchrun's group in it; `progress`
  carries its stages back; `lifeline` makes it die with the sweep.
- `probe` / `probe_child`: a user's code planned or predicted in a child process (api.plan, predict, fit).

Nothing is imported here: `python -m membench.launch.worker` loads only what a worker needs.
"""
