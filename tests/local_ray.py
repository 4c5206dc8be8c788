"""One local Ray for a test module's jobs and runtimes (:func:`local_ray`).

A :class:`~services.trainer.ray.runtime.RayRuntime` started while Ray is running attaches to it and, at its
shutdown, kills only its own actors and placement group; a ``ray.init`` and ``ray.shutdown`` per runtime cost
about 4.5 s each time on a 2-core machine (3.0 s and 1.3 s measured, idle).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from marti.config import load_config
from services.trainer.ray.auth import ClusterAuth
from services.trainer.ray.runtime import ray_init_kwargs, ray_processes_in_own_session


@contextlib.contextmanager
def local_ray(config: Path) -> Iterator[None]:
    """While open, the local Ray that ``config``'s job would start itself (:func:`ray_init_kwargs`), in its own
    session like the job's; ``RAY_AUTH_MODE`` is put back as it was afterwards. A Ray already running in this
    process is used as it is and left running, as a runtime would do."""
    import ray

    if ray.is_initialized():
        yield
        return
    auth = ClusterAuth.before_local_init()
    with ray_processes_in_own_session():
        ray.init(**ray_init_kwargs(load_config(config)))
    try:
        yield
    finally:
        ray.shutdown()
        auth.restore()
