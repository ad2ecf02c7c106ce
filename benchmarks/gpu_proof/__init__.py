"""The GPU half of the sidecar design, proven on one H200: LMCache's copy kernels, CUDA IPC into the real
`lmcache server` across processes, and what that path moves per second, measured as vLLM uses it, beside the host
link's own limit.

Why: CI has no GPU, so nothing else in the repository runs LMCache's CUDA extension or its CUDA IPC path. This package
is what `scripts/gpu-proof.sh` runs after building LMCache from its sdist on the GPU host:

``plan``     the cases, their geometry and bytes (pure arithmetic; the shell script's ``--dry-run`` prints it on CPU);
``kernels``  ``lmcache.cuda_ops.multi_layer_block_kv_transfer`` on the GPU (device -> pinned host objects -> device)
             for both models' paged layouts, checked byte for byte against LMCache's own PyTorch implementation of
             the kernel and a plain gather, and timed;
``ipc``      per case: the real ``lmcache server`` in its own process, started through ``lmcache-server`` below so
             that it logs when each store and retrieve reaches its handler, starts and ends its copy; this process
             is the GPU engine stand-in. It registers CUDA KV tensors shaped like the model's cache groups (LMCache's
             own vLLM group conversion, its lmcache-driven transfer context: CUDA IPC handles), and per request
             stores it with vLLM 0.33's align-mode block ids, looks it up until the whole request is visible,
             retrieves it into poisoned blocks and compares the bytes; for 1, 4, 8, 16 and 64 chunks per request.
             Per request it prints the client/transport time, the server's time before the copy, the copy and the
             time until a lookup sees the stored chunks, and the bytes the server really moved each way; then a
             pinned ``cudaMemcpy`` (``Tensor.copy_``) of the same sizes in both directions, in the same run;
``tp``       N worker processes (the TP ranks of one pod, here sharing one GPU: "single-GPU"), each registering its
             own KV tensors with the pod's server (or, ``--layouts per-rank``, with its own server, the connector's
             ``lmcache.mp.server_urls`` layout), storing and retrieving one request concurrently, with the roles
             LMCache's connector gives each rank; aggregate GB/s beside N concurrent pinned copies measured the same
             way, the server's CPU use, and p50/p99 latencies;
``vmm-ipc``  vLLM 0.34's extensible KV cache (its own ``ExtensibleTensor`` over driver-mapped memory, the files
             ``vmm-files`` takes from its wheel on a machine that has it) handed to each of LMCache 0.5.6's CUDA IPC
             wrappers and opened in a second process, beside ``torch.empty`` memory: whether the sidecar can share
             it, the reason the chart renders ``--no-enable-extensible-kv-cache`` with ``vllm.generation=0.34.0``;
``lmcache-server``  ``lmcache server`` with the phase probes installed (used by ``ipc`` and ``tp``).
             ``--device cpu`` rehearses ``ipc`` and ``tp`` on a CPU host (LMCache then moves the bytes through POSIX
             SHM), which is how this proof was made to work before it met a GPU.

Shapes are per TP worker and follow the profile table (`glm53.profiles`): group kinds, tokens per block and layer
counts come from there; the widths in ``geometry`` are this proof's estimates of the physical pages (documented beside
them).
Prints one JSON document (also written to ``--out``) and short tables last.

Run it as ``python3 benchmarks/gpu_proof COMMAND ...`` (a bare python3 on the GPU host: ``__main__.py`` finds src/) or
``python -m gpu_proof`` with benchmarks/ and src/ importable. One module a job:

``cli``       the command line and ``main``
``plan``      the settings of a run, the plan ``--dry-run`` prints, and their checks (pure)
``geometry``  the cases' KV geometry, vLLM's block ids and the bytes moved (pure)
``stats``     GB/s, percentiles, request phases, the shared clock and token ids (pure)
``server``    the real ``lmcache server`` with the chart's flags and phase probes; starting and reading it
``engine``    the engine stand-in: TP roles, registered KV tensors, store/lookup/retrieve and the byte comparison
``ipc``       the ``ipc`` command: one worker, the chunks-per-request curve, pinned copies
``tp``        the ``tp`` command: N rank processes on one GPU
``kernels``   the ``kernels`` command: ``cuda_ops`` against PyTorch references
``vmm_ipc``   the ``vmm-files`` and ``vmm-ipc`` commands: vLLM 0.34's VMM KV memory through LMCache's IPC wrappers
``report``    the tables, the JSON reports and each command's verdict
"""

from __future__ import annotations

PROG = "gpu-proof"
# The command line's description: this docstring's first line.
DESCRIPTION = (__doc__ or "").splitlines()[0]


class ProofError(Exception):
    """A failed check or bad input; its message is the one line printed."""
