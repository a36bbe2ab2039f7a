"""The child side of membench's processes: the only modules that import commands.

- `worker`: one Job in, one result file out (`python -m membench.child.worker JOB.json RESULT.json`).
- `probe`: a user's code planned (`plan.plan`), predicted or fitted in a child process, the answer written back.

launch/ starts these processes and never imports them. Nothing is imported here.
"""
