"""`glm53 exporter`: one Prometheus endpoint answering "is the cache geometry right?" and "is the cache paying off?".

Modules by concern: `facts` (the logs, through the probe's incremental reader), `upstream` (scraping vLLM's and
LMCache's metrics), `collector` (joining both into metric families at each scrape), `server` (HTTP), `names` (the
upstream metric names relied on).
"""
