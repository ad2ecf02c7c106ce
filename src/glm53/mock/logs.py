"""The engine stand-in's log lines, written by the formatters the real processes use, at the sites they log from.

vLLM 0.33 decorates its own records only: format `(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s
[%(fileinfo)s:%(lineno)d] %(message)s`, dates `%m-%d %H:%M:%S` (vllm/logger.py:28-33), and its NewLineFormatter repeats
that prefix after every line break of a multi-line message, tracebacks included (vllm/logging_utils/formatter.py:75-77:
`msg.replace("\\n", "\\r\\n" + prefix)`). Without DEBUG logging `fileinfo` is the bare file name (formatter.py:72).
vLLM is not installed next to the toolkit (its import needs torch 2.14), so that formatter is re-created here; each
record carries the upstream file and line it imitates, so a reader can check the site.

LMCache's connector lines are printed by LMCache's own logger (`lmcache.logging.init_logger`: its own stderr handler,
colour codes, `propagate=False`, no vLLM tag), imported lazily because torch and LMCache are the `pod` extra only.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# vllm/logger.py:28-33 (VLLM_LOGGING_PREFIX empty).
VLLM_FORMAT = "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
VLLM_DATE_FORMAT = "%m-%d %H:%M:%S"
VLLM_VERSION = "0.33.0"


@dataclass(frozen=True)
class Site:
    """An upstream logging call: the file name vLLM prints and its line in the released wheel."""

    file: str
    line: int


# Sites in vllm 0.33.0 and lmcache 0.5.6 (paths relative to the packages).
BANNER = Site("startup.py", 38)  # entrypoints/common/startup.py:38, log_version_and_model
NON_DEFAULT_ARGS = Site("startup.py", 96)  # entrypoints/common/startup.py:96
ATTENTION_BLOCK = Site("interface.py", 1108)  # platforms/interface.py:1108-1112
ENGINE_INIT = Site("core.py", 139)  # v1/engine/core.py:139-143
LOAD_DONE = Site("default_loader.py", 506)  # model_executor/model_loader/default_loader.py:506-509, once per worker
ENGINE_FAILED = Site("core.py", 1584)  # v1/engine/core.py:1584, logger.exception("EngineCore failed to start.")
SERVER_STARTED = Site("entry.py", 139)  # entrypoints/launchers/api_server/entry.py:139
RESET = Site("api_router.py", 39)  # entrypoints/serve/dev/cache/api_router.py:39
# v1/core/sched/scheduler.py:3764-3770 and :3773-3777 (_handle_invalid_blocks), per policy, for one KV group only.
LOAD_FAILED = Site("scheduler.py", 3764)
LOAD_RECOVERED = Site("scheduler.py", 3773)
# entrypoints/generate/base/serving.py:203-206 (_raise_if_error): a request finished with FinishReason.ERROR.
GENERATION_ERROR = Site("serving.py", 203)
# lmcache integration/vllm/lmcache_mp_connector.py; a record names the line its call starts on (what the real engine
# logs): :667-673 the geometry, :1280-1284 the bypass of a request whose load failed.
GEOMETRY = Site("lmcache_mp_connector.py", 667)
BYPASS = Site("lmcache_mp_connector.py", 1280)
CONNECTOR_LOGGER = "lmcache.integration.vllm.lmcache_mp_connector"


class VllmFormatter(logging.Formatter):
    """vLLM's NewLineFormatter without DEBUG paths: the prefix repeated after each line break (formatter.py:75-77)."""

    def __init__(self) -> None:
        super().__init__(VLLM_FORMAT, VLLM_DATE_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.fileinfo = record.filename
        text = super().format(record)
        if record.message != "":
            prefix = text.split(record.message)[0]
            text = text.replace("\n", "\r\n" + prefix)
        return text


def _vllm_handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(VllmFormatter())
    return handler


_HANDLER = _vllm_handler()


@dataclass(frozen=True)
class VllmLogger:
    """Records of one simulated vLLM process (APIServer, EngineCore_DP0, Worker_TP<n>) with its own pid."""

    process: str
    pid: int

    def log(self, level: int, site: Site, message: str, *args: Any, exc_info: bool = False) -> None:
        record = logging.LogRecord("vllm", level, site.file, site.line, message, args, None)
        record.created = time.time()
        record.process = self.pid
        record.vllm_process_name = self.process
        if exc_info:
            record.exc_info = sys.exc_info()
        _HANDLER.handle(record)

    def info(self, site: Site, message: str, *args: Any) -> None:
        self.log(logging.INFO, site, message, *args)

    def warning(self, site: Site, message: str, *args: Any) -> None:
        self.log(logging.WARNING, site, message, *args)

    def error(self, site: Site, message: str, *args: Any) -> None:
        self.log(logging.ERROR, site, message, *args)

    def exception(self, site: Site, message: str) -> None:
        """ERROR with the traceback of the exception being handled, as `logger.exception` prints it."""
        self.log(logging.ERROR, site, message, exc_info=True)


# vllm 0.33.0 entrypoints/common/startup.py:16-38 (log_version_and_model): the logo unless VLLM_DISABLE_LOG_LOGO=1
# (envs.py:2184) or no vLLM formatter is installed; monochrome unless the ColoredFormatter is (a terminal), so a pod's
# log file gets this. vLLM 0.32 prints the same logo (entrypoints/serve/utils/api_utils.py:325-347).
LOGO = (
    "\n       \u2588     \u2588     \u2588\u2584   \u2584\u2588\n"
    " \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version %s\n"
    "  \u2588\u2584\u2588\u2580 \u2588     \u2588     \u2588     \u2588  model   %s\n"
    "   \u2580\u2580  \u2580\u2580\u2580\u2580\u2580 \u2580\u2580\u2580\u2580\u2580 \u2580     \u2580\n"
)
PLAIN_BANNER = "vLLM server version %s, serving model %s"
LOGO_OFF_ENV = "VLLM_DISABLE_LOG_LOGO"


def banner_format(environ: Mapping[str, str]) -> str:
    """The start banner's format (version, model): vLLM's logo, or its plain line with VLLM_DISABLE_LOG_LOGO=1."""
    try:
        plain = bool(int(environ.get(LOGO_OFF_ENV, "0")))
    except ValueError:
        plain = False
    return PLAIN_BANNER if plain else LOGO


def log_connector(level: int, site: Site, message: str, *args: Any) -> None:
    """A line of LMCache's connector through LMCache's real logger, at the connector's site."""
    from lmcache.logging import init_logger  # the pod extra; never imported by the slim toolkit

    logger = init_logger(CONNECTOR_LOGGER)
    logger.handle(logger.makeRecord(CONNECTOR_LOGGER, level, site.file, site.line, message, args, None))


def log_geometry(group_tokens_per_block: list[int], scheduler_block_size: int, cache_model_name: str) -> None:
    """The connector's geometry line, as lmcache_mp_connector.py:667-673 logs it."""
    log_connector(
        logging.INFO,
        GEOMETRY,
        "Resolved LMCache MP geometry: group_tokens_per_block=%s, scheduler_block_size=%d, cache_model_name=%s",
        group_tokens_per_block,
        scheduler_block_size,
        cache_model_name,
    )
