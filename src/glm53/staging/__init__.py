"""The stage step: the model's weights downloaded, resumably and verified, before the engine starts (issue 24).

Why: the engine used to download its own weights at start, inside the startup probe's budget; a checkpoint of
hundreds of GB outlasts any sensible budget, the kubelet kills the engine mid-download and the pod loops. Here a
separate container, `glm53 stage-weights run`, stages the profile's repository at a pinned revision into the Hugging
Face cache on the weights volume with the real `huggingface_hub` client (2.4.0), checks every byte against the hashes
the hub lists, and writes a completion marker; the engine then starts offline (HF_HUB_OFFLINE=1).

- `progress`: pure arithmetic and wording (bytes, files, rate, ETA);
- `status`: the status file the stage container's startup probe reads (standard library only: the probe is cheap);
- `layout`: where things live in the Hugging Face cache, and the completion marker;
- `hub`: the `huggingface_hub` calls (listing, file metadata, the resumable download) and what their errors mean;
- `stager`: the procedure, and the resident loop the chart's container runs (retries instead of a crash loop);
- `metrics`: the stage step's own Prometheus metrics (bytes staged, done, failed);
- `standin`: a loopback stand-in of the hub's file API, for the tests and the benchmark (the hub is out of reach).
"""
