"""The kind-cluster smoke test of the chart in CPU-mock mode, one job per module.

`plan`: the options, phases (exit codes) and typed steps of a run; `preflight`: what the run needs of the machine and
whether it has it; `verdicts`: readiness, geometry and the failure report, judged from what the cluster returns;
`run`: the one module with I/O, which executes the plan. The first three are pure, so the tests drive them with data.
"""
