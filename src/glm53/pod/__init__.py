"""The pod the chart defines, run: rendered, planned and started as a kubelet would, alone, in a fleet, under faults.

Modules by step: `contract` (the chart's names, once in Python), `chart` (Helm's engine in-process), `plan` (the
rendered Deployment as frozen records), `loopback` (a plan run as processes on 127.0.0.1), `kubelet` (restarts and
liveness after Ready), `main_job` (the README's main job), `fleet` (replicas behind vllm-router), `faults/` (the
sidecar hurt under load), `kind/` (the kind-cluster smoke test).
"""
