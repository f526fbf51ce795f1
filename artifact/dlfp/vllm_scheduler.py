"""Former import path of the scheduler patch, kept so that ``--scheduler-cls dlfp.vllm_scheduler.DLFPScheduler``
keeps working. The code lives in ``dlfp.backends.vllm.scheduler``."""
from dlfp.backends.vllm.scheduler import (  # noqa: F401
    DLFPAsyncScheduler,
    DLFPConfigError,
    DLFPScheduler,
    DLFPSchedulerMixin,
    DLFPSettings,
    parse_settings,
    read_log,
)
